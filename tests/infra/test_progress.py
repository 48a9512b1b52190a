"""The one progress bar (pitcheck/infra/progress.py): drawn on stderr when enabled, the total once."""
import pytest

from pitcheck.infra import progress
from pitcheck.infra.progress import Progress, hms


def test_a_bar_draws_its_label_count_and_the_total_once(capsys):
    p = Progress(10, "demo", enabled=True, min_interval=0.0)
    p.update(5)
    p.update(10)
    p.update(10)  # the loop and the run's end both report the last step: drawn once
    err = capsys.readouterr().err
    assert err == "\rdemo [" + "#" * 15 + " " * 15 + "] 5/10" + "\rdemo [" + "#" * 30 + "] 10/10\n"


def test_a_disabled_bar_draws_nothing(capsys):
    quiet = Progress(10, "quiet", enabled=False)
    quiet.update(10)
    assert capsys.readouterr().err == ""


def test_updates_within_the_interval_are_not_drawn_but_the_total_is(capsys, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    p = Progress(4, "x", enabled=True, min_interval=0.1)
    p.update(1)
    p.update(2)  # 0 s later: skipped
    now[0] += 0.2
    p.update(3)
    p.update(4)  # the total: always drawn
    assert [line.split("] ")[1] for line in capsys.readouterr().err.strip().split("\r") if line] == [
        "1/4", "3/4", "4/4"]


def test_a_counting_bar_with_unit_eta_and_note(capsys, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    p = Progress(4, "compare", enabled=True, done=1, unit=" cells", eta=True, pad=70, min_interval=0.0)
    p.update(1)  # nothing counted yet: no rate
    now[0] = 10.0
    p.advance("cell-a")  # 1 counted in 10 s, 2 left: 20 s
    now[0] = 30.0
    p.advance()
    p.advance("cell-c")
    lines = [line for line in capsys.readouterr().err.split("\r") if line]
    assert [line.split("] ", 1)[1].rstrip() for line in lines] == [
        "1/4 cells  ETA --:--", "2/4 cells  ETA 0:20  cell-a", "3/4 cells  ETA 0:15", "4/4 cells  took 0:30  cell-c"]
    assert all(len(line.rstrip("\n")) == 69 for line in lines)  # pad counts the leading carriage return


@pytest.mark.parametrize("seconds, text", [(0, "0:00"), (59.6, "1:00"), (61, "1:01"), (3599, "59:59"),
                                           (3600, "1:00:00"), (3725, "1:02:05")])
def test_hms(seconds, text):
    assert hms(seconds) == text
