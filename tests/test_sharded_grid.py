"""A compare grid of sharded cells: `shards` in [fixed] shards every cell, whose run directories then record
shard_distance_Z/T and replica_spread beside the usual metrics."""
import pytest

from pitcheck import sweep as sw
from pitcheck.rundir import read_metrics

pytest.importorskip("torch")


def test_a_grid_with_fixed_shards_runs_sharded_cells(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text('steps = 6\nrecords_per_decade = 5\n[axes]\nretraction = ["cholqr2"]\nprecision = ["fp32"]\n'
                    'shape = ["47x4"]\nseed = [0]\n[fixed]\nshards = 2\ndevice = "cpu"\n')
    sw.sweep(tmp_path / "out", sw.load_grid(str(grid)), workers=1)
    (cell,) = sw.cells(sw.load_grid(str(grid)))
    assert cell.config.shards == 2
    rows = read_metrics(sw.cell_dir(tmp_path / "out", cell) / "metrics.csv")
    assert rows[-1]["step"] == 6
    assert 0 < rows[-1]["shard_distance_Z"] < 4 * 4 * 6  # the bound of results/sharded/NOTE.md, in u
    assert rows[-1]["replica_spread"] == 0.0
