"""`pitcheck run --shards N`: Z row-sharded over gloo ranks against the single-process run on the same
gradients (shard_distance in u), T's replicas, the run directory's crash safety, and the refusals.

Bound (the closing note derives it): each step's distributed retraction sums the D x D Gram (cholqr2,
polar-gram) or stacks TSQR's R factors in another order than one process, which moves the result by a
few u times a modest factor of D per step; the runs then drift apart by at most that per step, so after
k steps shard_distance_Z <= C * D * k with C = 4 (measured: well under it, see results/sharded/).
"""
import csv
import math

import numpy as np
import pytest

from pitcheck.infra.errors import PitcheckError
from pitcheck.trajectory import RunConfig, run

pytest.importorskip("torch.distributed")

V, D, STEPS = 47, 4, 8  # V odd: the 2 ranks own 24 and 23 rows (an uneven last slice)
BOUND_C = 4.0


def _cfg(**over):
    base = dict(backend="torch", precision="fp32", retraction="cholqr2", vocab=V, dim=D, steps=STEPS,
                adversary="gaussian", seed=3, device="cpu", records_per_decade=4, shards=2)
    return RunConfig(**{**base, **over})


def _rows(out):
    with open(out / "metrics.csv") as f:
        return list(csv.DictReader(f))


def _within_bound(rows, dim=D):
    for r in rows:
        k = int(r["step"])
        assert float(r["shard_distance_Z"]) <= BOUND_C * dim * max(k, 1), r
        assert float(r["replica_spread"]) == 0.0


@pytest.mark.parametrize("retraction", ["cholqr2", "polar-gram", "qr"])
@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_sharded_matches_single_process_within_bound(tmp_path, precision, retraction):
    rows = run(_cfg(precision=precision, retraction=retraction), tmp_path / "r", progress=False)
    _within_bound(rows)
    assert rows[-1]["shard_distance_Z"] > 0  # the sums do run in another order: not the same computation
    assert rows[-1]["orthonormality"] < 1e3 * D * float(np.finfo(np.float32 if precision == "fp32" else np.float64).eps)
    assert all(math.isnan(r["penrose"]) for r in rows)  # not computed on shards, NaN by design


def test_zero_padding_is_harmless_four_ranks(tmp_path):
    # V = 50 over 4 ranks padded to a multiple of 8 x 4 = 64: the last rank holds 2 real rows and 14 zero rows
    padded = run(_cfg(vocab=50, shards=4, steps=6, pad_multiple=8, optimizer="adam"), tmp_path / "padded", progress=False)
    _within_bound(padded)
    ck = np.load(tmp_path / "padded" / "checkpoint.npz")
    Z = ck["sharded_master_Z"]
    assert Z.shape == (64, D) and np.abs(Z[:50]).sum(1).min() > 0
    # zero rows add nothing to a Gram and the apply keeps them zero: still exactly zero after the steps
    assert not Z[50:].any() and not ck["sharded_opt_mZ"][50:].any()


def test_bf16_allreduce_costs_accuracy(tmp_path):
    # an fp64 run whose Grams cross the ranks in bf16 (u = 2^-8): far outside what reduction order explains
    rows = run(_cfg(precision="fp64", steps=4, allreduce_dtype="bf16"), tmp_path / "bf16", progress=False)
    assert rows[-1]["shard_distance_Z"] > 1e6 * BOUND_C * D * rows[-1]["step"]
    assert rows[-1]["replica_spread"] == 0.0  # lossy, but the same bits on every rank


@pytest.mark.parametrize("over,message", [
    (dict(shards=0), "--shards must be in"),
    (dict(shards=V + 1), "--shards must be in"),
    (dict(backend="numpy", precision="fp64"), "torch backend"),
    (dict(allreduce_dtype="fp8"), "unknown --allreduce-dtype"),
    (dict(shards=1, pad_multiple=8), "only make sense with --shards"),
    (dict(pad_multiple=-1), "--pad-multiple must be >= 0"),
    (dict(retraction="cayley-iter"), "no distributed retraction"),
    (dict(precision="bf16"), "factor dtype"),
    (dict(head="tied", retraction="qr"), "--head pit"),
])
def test_bad_sharding_is_one_line_error(tmp_path, over, message):
    with pytest.raises(PitcheckError, match=message) as err:
        run(_cfg(**over), tmp_path / "r", progress=False)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "r").exists()


# ---- metrics.csv's shard columns (rundir.SHARD_COLUMNS) --------------------------------------------------
def test_shard_columns_are_written_and_read_back(tmp_path):
    from pitcheck.infra.rundir import CSV_COLUMNS, SHARD_COLUMNS, read_metrics

    rows = run(_cfg(steps=3), tmp_path / "r", progress=False)
    header = (tmp_path / "r" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header == CSV_COLUMNS and header[-3:] == SHARD_COLUMNS
    back = read_metrics(tmp_path / "r" / "metrics.csv", CSV_COLUMNS)
    assert [r["shard_distance_Z"] for r in back] == [r["shard_distance_Z"] for r in rows]
    assert all(r["replica_spread"] == 0.0 for r in back)


def test_csv_bytes_of_unsharded_rows_has_no_shard_columns_and_an_empty_cell_where_a_row_lacks_them():
    import tempfile
    from pathlib import Path

    from pitcheck.infra.rundir import CSV_COLUMNS, LOSS_COLUMNS, METRIC_COLUMNS, SHARD_COLUMNS, csv_bytes, read_metrics

    base = {k: 1.0 for k in METRIC_COLUMNS}
    plain = [{**base, "step": 0}, {**base, "step": 1}]
    text = csv_bytes(plain).decode()
    assert text.splitlines()[0].split(",") == METRIC_COLUMNS + LOSS_COLUMNS  # no shard columns: bytes as before
    mixed = [{**base, "step": 0}, {**base, "step": 1, **{k: 2.0 for k in SHARD_COLUMNS}}]
    lines = csv_bytes(mixed).decode().splitlines()
    assert lines[0].split(",") == CSV_COLUMNS and lines[1].endswith(",,,,,,") and lines[2].endswith(",2.0,2.0,2.0")
    with tempfile.TemporaryDirectory() as d:
        for rows, want in ((plain, [set(METRIC_COLUMNS)] * 2),
                           (mixed, [set(METRIC_COLUMNS), set(METRIC_COLUMNS) | set(SHARD_COLUMNS)])):
            p = Path(d) / "metrics.csv"
            p.write_bytes(csv_bytes(rows))
            assert [set(r) for r in read_metrics(p, CSV_COLUMNS)] == want


def test_committed_sharded_run_directories_still_read():
    from pathlib import Path

    from pitcheck.infra.rundir import CSV_COLUMNS, read_metrics

    root = Path(__file__).resolve().parents[2] / "results" / "sharded"
    dirs = sorted(p.parent for p in root.glob("*/metrics.csv"))
    assert dirs
    for d in dirs:
        rows = read_metrics(d / "metrics.csv", CSV_COLUMNS)
        assert all(r["replica_spread"] == 0.0 for r in rows) and rows[-1]["shard_distance_Z"] > 0
