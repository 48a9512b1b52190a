"""`pitcheck plot` of a metric a run does not record (a baseline head has no T): refused in one line when no run
records it, noted in its panel when some do; never an empty panel with matplotlib's raw legend warning."""
import warnings

import pytest

from pitcheck import PitcheckError
from pitcheck.verbs.plot import plot_runs
from pitcheck.trajectory import RunConfig, run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for head in ("tied", "pit"):
        run(RunConfig(head=head, vocab=16, dim=4, steps=3, records_per_decade=4), root / head, progress=False)
    return root


def test_a_metric_no_run_records_is_refused_in_one_line(runs, tmp_path):
    with pytest.raises(PitcheckError, match="no run given records cond_T") as info:
        plot_runs([runs / "tied"], tmp_path / "p.png", ["cond_T", "orthonormality"])
    assert "\n" not in str(info.value)
    assert not (tmp_path / "p.png").exists()


def test_a_metric_some_runs_lack_is_drawn_with_a_note_and_no_warning(runs, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot_runs([runs / "tied", runs / "pit"], tmp_path / "p.svg", ["cond_T", "orthonormality"])
    assert not [str(w.message) for w in caught if "legend" in str(w.message) or "artists" in str(w.message)]
    assert "not recorded: tied" in (tmp_path / "p.svg").read_text()


@pytest.mark.parametrize("fmt,end", [("png", b"IEND\xaeB`\x82"), ("svg", b"</svg>\n")])
def test_a_plot_written_to_stdout_is_the_image_alone(runs, tmp_path, fmt, end):
    # the saved path is said on stderr when the image itself goes to stdout, not appended to it
    import subprocess
    import sys

    image = tmp_path / f"out.{fmt}"
    with open(image, "wb") as stdout:
        done = subprocess.run([sys.executable, "-m", "pitcheck.cli", "plot", str(runs / "pit"), "--out", "/dev/stdout",
                               "--format", fmt], stdout=stdout, stderr=subprocess.PIPE, timeout=120)
    assert done.returncode == 0, done.stderr
    assert image.read_bytes().endswith(end)
    assert done.stderr.decode().strip().splitlines()[-1] == "/dev/stdout"


def test_the_default_metrics_are_those_the_runs_record(runs, tmp_path):
    """A baseline head (or a stress target's run) has no triangular solve: with no --metrics given, its plot
    leaves trisolve_forward out, where it was refused with 'leave it out of --metrics' though none was given."""
    from pitcheck.verbs.plot import read_runs, recorded_defaults

    assert recorded_defaults(read_runs([runs / "tied"], [])) == ["orthonormality", "pinv_drift"]
    assert recorded_defaults(read_runs([runs / "tied", runs / "pit"], [])) == ["orthonormality", "pinv_drift",
                                                                              "trisolve_forward"]
    assert plot_runs([runs / "tied"], tmp_path / "p.png").is_file()
    # named explicitly, a metric no run records is still refused
    with pytest.raises(PitcheckError, match="no run given records trisolve_forward"):
        plot_runs([runs / "tied"], tmp_path / "q.png", ["trisolve_forward"])
