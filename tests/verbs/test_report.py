"""Plots of run directories, and compare's refusal of unknown names."""
import pytest

from pitcheck import PitcheckError, cli
from pitcheck.verbs.plot import plot_runs


def test_compare_and_plot_reject_bad_input(tmp_path, capsys):
    with pytest.raises(PitcheckError, match="not a run directory"):
        plot_runs([tmp_path], tmp_path / "x.png", ["pinv_drift"])
    assert cli.main(["compare", "--retractions", "qr,nope", "--out", str(tmp_path / "c")]) == 2
    assert "unknown retraction 'nope'" in capsys.readouterr().err


def test_plot_runs_draws_any_metric(tmp_path):
    cli.main(["run", "--vocab", "40", "--dim", "4", "--steps", "5", "--out", str(tmp_path / "r")])
    png = plot_runs([tmp_path / "r"], tmp_path / "p.png", ["orthonormality", "cond_T"])
    assert png.stat().st_size > 5_000
    with pytest.raises(PitcheckError, match="unknown metric"):
        plot_runs([tmp_path / "r"], tmp_path / "q.png", ["speed"])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("plot") / "r"
    assert cli.main(["run", "--vocab", "40", "--dim", "4", "--steps", "5", "--no-progress", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("name, magic", [("p.svg", b"<svg"), ("p.pdf", b"%PDF-"), ("p.PNG", b"\x89PNG"),
                                         ("p", b"\x89PNG")])
def test_plot_writes_the_format_its_suffix_names(tmp_path, run_dir, name, magic):
    """.svg and .pdf were PNG bytes under those names; no suffix (/dev/null, /dev/stdout) is a PNG."""
    assert cli.main(["plot", str(run_dir), "--metrics", "orthonormality", "--out", str(tmp_path / name)]) == 0
    head = (tmp_path / name).read_bytes()[:400]
    assert magic in head


def test_plot_refuses_a_suffix_it_cannot_draw_before_reading_the_runs(tmp_path, capsys):
    # the run directory does not exist: the suffix is refused first, nothing is read or drawn
    for name in ("p.jpg", "metrics.csv"):
        assert cli.main(["plot", str(tmp_path / "no-run"), "--out", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and name in err[0] and ".png, .svg or .pdf" in err[0]
        assert not (tmp_path / name).exists()


def test_plot_to_a_fifo_writes_in_place(tmp_path, run_dir):
    import fcntl
    import os
    import stat

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader waiting: opening to write does not block
    try:
        fcntl.fcntl(reader, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)  # room for the whole PNG
        assert cli.main(["plot", str(run_dir), "--metrics", "cond_T", "--out", str(fifo)]) == 0
        data = os.read(reader, 1 << 20)
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and data.startswith(b"\x89PNG")
