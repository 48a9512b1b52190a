"""A lost device context (CUDA's sticky errors: a device-side assert poisons every later call of the process)
never fails a correct module: the refusal counts as a refusal, and what remains runs in a fresh worker
under the same time limit. Run on the CPU through tests/zoo/_lost_context.py, a stand-in whose embed of an
out-of-range id returns a result that raises when read and loses this process's "context"; the worker's
detection of the loss is the module-level pitcheck.verbs.validate.device.context_lost, which the stand-in
replaces inside the worker's process. Also: a target built on another device than the one asked for
cannot be run (exit 2), and a timeout names the slowest phases."""
import time
from pathlib import Path

import pytest

from pitcheck.cli import main
from pitcheck.verbs.validate import validate
from tests.zoo import _lost_context

ROOT = Path(__file__).resolve().parents[3]
STAND_IN = "tests.zoo._lost_context:make"
TINY = dict(vocab=64, dim=4, steps=3, timeout=120)
TINY_ARGS = ["--vocab", "64", "--dim", "4", "--steps", "3"]


def details(check) -> dict:
    return {d["state"]: d for d in check.details}


def test_a_device_assert_on_bad_ids_is_a_refusal_and_the_rest_runs_in_a_fresh_worker():
    result = validate(STAND_IN, "float32", checks="contract,bad_input,scale", **TINY)
    assert result.ok, result.fatal or result.table()
    cases = details(result.by_name()["bad_input"])
    for name in ("id -1", "id V"):  # each lost its worker's context; each is that case's refusal
        assert cases[name]["verdict"] == "pass" and "device-side assert" in cases[name]["reason"], cases[name]
    # the cases after them ran in a later worker and were judged, not skipped
    assert set(cases) == {"id -1", "id V", "float ids", "empty batch", "nan hidden row", "inf hidden row"}
    assert cases["empty batch"]["reason"] == "empty (0, D) result"
    assert result.by_name()["scale"].verdict == "pass"
    # the result says that fresh processes took over, and why
    assert len(result.restarts) == 2 and "device-side assert" in " ".join(result.restarts), result.restarts
    assert "the device's context was lost 2 times" in result.summary()
    assert result.to_json()["restarts"] == result.restarts


def test_in_the_validators_own_process_a_lost_context_is_said_not_blamed_on_the_target(monkeypatch):
    from pitcheck.verbs.validate import device

    # the stand-in replaces the detection and loses the context in this process: both undone after the test
    monkeypatch.setattr(device, "context_lost", device.context_lost)
    monkeypatch.setitem(_lost_context.LOST, "after", "")

    def make(vocab_size, hidden_size, **kw):  # a local function: not importable by name, so not isolated
        return _lost_context.make(vocab_size, hidden_size, **kw)

    result = validate(make, "float32", checks="contract,bad_input,scale", **TINY)
    assert result.exit_status == 2
    assert "cannot start a fresh process" in result.fatal and "module:factory" in result.fatal, result.fatal
    verdicts = result.by_name()
    assert verdicts["contract"].verdict == "pass"
    for name in ("bad_input", "scale"):
        assert verdicts[name].verdict == "error" and "the target raised" not in verdicts[name].reason
        assert "context was lost" in verdicts[name].reason, verdicts[name].reason


# a target file outside the checkout reaches the stand-in through the checkout's directory
PREAMBLE = f"import sys\nsys.path.append({str(ROOT)!r})\n"
BUILD_LOSES = PREAMBLE + """\
from tests.zoo import _lost_context
def make(V, D, **kw):
    module = _lost_context.make(V, D, **kw)
    _lost_context.LOST["after"] = "the build"
    return module
"""


def test_a_build_that_loses_the_context_is_exit_2_with_one_reason(tmp_path, capsys, monkeypatch):
    (tmp_path / "loses.py").write_text(BUILD_LOSES)
    status = main(["validate", f"{tmp_path / 'loses.py'}:make", *TINY_ARGS, "--checks", "contract,penrose"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "lost the cpu device's context" in err[0], err


RESTART_HANGS = PREAMBLE + """\
import os, time
from tests.zoo import _lost_context
MARK, SLOW = {mark!r}, {slow!r}
def make(V, D, **kw):
    if os.path.exists(MARK):  # a worker after the one that lost its context
        while True:
            time.sleep(0.1)
    module = _lost_context.make(V, D, **kw)
    embed = module.embed
    def marking_embed(ids):
        value = embed(ids)
        if _lost_context.LOST["after"] and not os.path.exists(MARK):
            open(MARK, "w").close()
            time.sleep(SLOW)  # the first worker's time counts against the limit of the next
        return value
    module.embed = marking_embed
    return module
"""


def test_a_fresh_worker_shares_the_time_limit_and_a_timeout_names_the_slowest_phases(tmp_path):
    # the first worker spends `slow` s in bad_input after losing its context; the next one hangs in its build
    limit, slow = 20, 6.0
    (tmp_path / "restart_hangs.py").write_text(RESTART_HANGS.format(mark=str(tmp_path / "lost"), slow=slow))
    start = time.monotonic()
    result = validate(f"{tmp_path / 'restart_hangs.py'}:make", "float32", checks="bad_input,scale",
                      **dict(TINY, timeout=limit))
    elapsed = time.monotonic() - start
    assert (tmp_path / "lost").exists(), result.fatal  # the first worker lost its context
    assert result.exit_status == 2 and f"timed out after {limit} s during build" in result.fatal, result.fatal
    assert elapsed < limit + slow - 1  # one limit for both workers, not one each
    slowest = result.fatal.split("slowest phases: ")[1]
    assert "build " in slowest and "check bad_input " in slowest, result.fatal


def test_a_hang_names_how_long_its_phases_took():
    # 8 s: the build (the hang) outlasts the child's import of torch, 2.3 s on a loaded 2-core machine
    result = validate("tests.zoo.hang:make", "float32", checks="contract", vocab=64, dim=4, timeout=8)
    assert result.exit_status == 2 and "timed out after 8 s during build" in result.fatal
    slowest = result.fatal.split("slowest phases: ")[1]
    first, seconds = slowest.split(",")[0].rsplit(" ", 2)[:2]
    assert first == "build" and float(seconds) >= 2.0, result.fatal


META = """\
from pitcheck.nn import make as _make
def make(V, D, *, dtype, device, seed):
    return _make(V, D, dtype=dtype, device="meta", seed=seed)
"""


@pytest.mark.parametrize("isolate", [True, False])
def test_a_module_on_the_meta_device_cannot_be_run(tmp_path, capsys, isolate):
    (tmp_path / "meta.py").write_text(META)
    if isolate:
        status = main(["validate", f"{tmp_path / 'meta.py'}:make", *TINY_ARGS])
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and len(err) == 1, err
        reason = err[0]
    else:
        import importlib.util

        spec = importlib.util.spec_from_file_location("meta_target", tmp_path / "meta.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        result = validate(lambda V, D, **kw: module.make(V, D, **kw), "float32", **TINY)
        assert result.exit_status == 2
        reason = result.fatal
    assert "on the meta device" in reason and "not on cpu" in reason, reason
    assert "Z" in reason and "item()" not in reason


# a worker that says it lost its context (status 4 and lost.txt, as the worker writes them) without saving
# anything: a fresh worker would do the same again
NO_PROGRESS = """\
import os, sys
def make(V, D, **kw):
    open(os.path.join(os.path.dirname(sys.argv[1]), "lost.txt"), "w").write("context lost after build: stand-in")
    os._exit(4)
"""


def test_a_worker_that_loses_its_context_without_a_result_is_not_restarted_again(tmp_path):
    (tmp_path / "no_progress.py").write_text(NO_PROGRESS)
    start = time.monotonic()
    result = validate(f"{tmp_path / 'no_progress.py'}:make", "float32", checks="contract", **TINY)
    assert result.exit_status == 2 and time.monotonic() - start < 60
    assert "lost its device context without a result" in result.fatal, result.fatal
