"""The validator's isolation of the target's process: a target that ends its own process early is an error,
never a pass; the working directory cannot shadow the standard library or pitcheck; no process of the
target outlives the validation, even when the validator is SIGKILLed; the pytest plugin's items are one
per id with a one-line reason each."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pitcheck.cli import main
from pitcheck.verbs.validate import validate
from pitcheck.verbs.validate.lifeline import TAG_VAR

ROOT = Path(__file__).resolve().parents[3]
TINY = dict(vocab=64, dim=4, steps=3, timeout=120)
TINY_ARGS = ["--vocab", "64", "--dim", "4", "--steps", "3", "--timeout", "120"]


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan may wait for a reaper that this sandbox's init is not)."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def gone_within(pids, seconds: float) -> list[int]:
    """The pids still running after `seconds` (empty: all gone)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if running(pid)]
        if not alive:
            return []
        time.sleep(0.1)
    return [pid for pid in pids if running(pid)]


def tagged(tag: str) -> list[int]:
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle in open(f"/proc/{entry}/environ", "rb").read().split(b"\0") and running(int(entry)):
                found.append(int(entry))
        except OSError:
            continue
    return found


def env_with_pitcheck() -> dict:
    """A child's environment that imports this checkout's pitcheck whatever its working directory."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH")] if p)}


# ---- a target that ends its own process early ----------------------------------------------------------

EARLY_EXITS = {
    "import": "import os\nos._exit(0)\ndef make(V, D, **kw):\n    pass\n",
    "build": "import os\ndef make(V, D, **kw):\n    os._exit(0)\n",
}


@pytest.mark.parametrize("phase", sorted(EARLY_EXITS))
def test_a_target_that_exits_with_status_0_is_a_target_error_not_a_pass(tmp_path, capsys, phase):
    (tmp_path / "quitter.py").write_text(EARLY_EXITS[phase])
    target = f"{tmp_path / 'quitter.py'}:make"
    status = main(["validate", target, *TINY_ARGS, "--checks", "contract,penrose", "--json", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and f"exited with status 0 during {phase}" in err[0], err
    data = json.loads((tmp_path / "r.json").read_text())  # what the API's result holds: ok is exit_status == 0
    assert data["exit_status"] == 2 and [c["verdict"] for c in data["checks"]] == ["error", "error"]


POST_STEP_EXIT = ("import os\nfrom pitcheck.nn import make as _make\n"
                  "def make(V, D, **kw):\n"
                  "    m = _make(V, D, **kw)\n"
                  "    m.post_step = lambda: os._exit(0)\n"
                  "    return m\n")


def test_an_exit_inside_post_step_gives_every_requested_check_a_verdict_with_the_reason(tmp_path):
    (tmp_path / "quitter.py").write_text(POST_STEP_EXIT)
    checks = ["bad_input", "contract", "penrose", "reference"]
    result = validate(f"{tmp_path / 'quitter.py'}:make", "float32", checks=checks, **TINY)
    assert not result.ok and result.exit_status == 2
    assert [c.name for c in result.checks] == checks, result.table()
    verdicts = result.by_name()
    assert verdicts["bad_input"].verdict == "pass"  # it takes no step
    # contract takes one of the module's own steps (post_step's dtypes): the check the target died in
    assert verdicts["contract"].verdict == "error"
    assert "exited with status 0 during check contract" in verdicts["contract"].reason
    for name in ("penrose", "reference"):
        assert verdicts[name].verdict == "error" and "status 0 during check contract" in verdicts[name].reason


def test_the_pytest_plugin_fails_each_item_of_an_early_exit_with_one_line(tmp_path):
    (tmp_path / "quitter.py").write_text(POST_STEP_EXIT)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "pitcheck", "-rf",
                           "--pitcheck", f"{tmp_path / 'quitter.py'}:make", "--pitcheck-checks", "contract,penrose",
                           "--pitcheck-vocab", "64", "--pitcheck-dim", "4", "--pitcheck-steps", "3", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env_with_pitcheck())
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "2 failed" in out and "KeyError" not in out and "Traceback" not in out, out
    # each item's report is the one-line reason
    assert out.count("\ntarget error: target exited with status 0 during check contract\n") == 2, out


# ---- the working directory cannot shadow the standard library or pitcheck -------------------------------

def _shadowing_directory(where: Path) -> None:
    for name in ("random", "json", "numbers", "typing"):
        (where / f"{name}.py").write_text(f"raise RuntimeError('the {name}.py of the working directory was imported')\n")


def test_library_names_in_the_working_directory_do_not_shadow_pitchecks_imports(tmp_path, monkeypatch):
    _shadowing_directory(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = validate("pitcheck.nn:make", "float32", checks="contract,bad_input", **TINY)
    assert result.ok, result.fatal or result.table()


def test_a_target_module_in_the_working_directory_is_still_found(tmp_path, monkeypatch):
    # `mypit:make` and `mypkg.pit:make` are found from the working directory, as `python -c 'import mypit'`
    # finds them; a json.py there reaches neither pitcheck nor the target's own `import json`
    _shadowing_directory(tmp_path)
    (tmp_path / "mypit.py").write_text("import json, random\nfrom pitcheck.nn import make\n")
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "helpers.py").write_text("from pitcheck.nn import make\n")
    (tmp_path / "mypkg" / "pit.py").write_text("from .helpers import make\n")
    monkeypatch.chdir(tmp_path)
    for target in ("mypit:make", "mypkg.pit:make"):
        result = validate(target, "float32", checks="contract", **TINY)
        assert result.ok, (target, result.fatal or result.table())


def test_the_working_directorys_package_wins_over_an_installed_one_of_its_name(tmp_path, monkeypatch):
    # an installed top-level package named like the user's (e.g. a stray `tests` in site-packages)
    installed, work = tmp_path / "site", tmp_path / "work"
    (installed / "mypkg").mkdir(parents=True)
    (installed / "mypkg" / "__init__.py").write_text("")
    (work / "mypkg").mkdir(parents=True)
    (work / "mypkg" / "__init__.py").write_text("")
    (work / "mypkg" / "pit.py").write_text("from pitcheck.nn import make\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in [os.environ.get("PYTHONPATH"), str(installed)] if p))
    monkeypatch.chdir(work)
    result = validate("mypkg.pit:make", "float32", checks="contract", **TINY)
    assert result.ok, result.fatal or result.table()


def test_a_target_named_like_a_standard_module_is_pointed_at_its_path(tmp_path, monkeypatch):
    (tmp_path / "json.py").write_text("from pitcheck.nn import make\n")
    monkeypatch.chdir(tmp_path)
    result = validate("json:make", "float32", checks="contract", **TINY)
    assert result.exit_status == 2 and "json.py:make" in result.fatal
    assert validate("json.py:make", "float32", checks="contract", **TINY).ok


CONSOLE_SCRIPT = Path(sys.executable).parent / "pitcheck"


@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="no pitcheck console script beside this Python")
def test_the_cli_in_a_directory_full_of_library_names_validates(tmp_path):
    _shadowing_directory(tmp_path)
    proc = subprocess.run([str(CONSOLE_SCRIPT), "validate", "pitcheck.nn:make", *TINY_ARGS, "--checks", "contract"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env_with_pitcheck())
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- no process of the target outlives the validation -------------------------------------------------

SPAWNER = """\
import os, subprocess, sys, time
def make(V, D, **kw):
    marker = {marker!r}
    pids = [os.getpid(),
            subprocess.Popen(['sleep', '600']).pid,                          # in the worker's process group
            subprocess.Popen(['sleep', '600'], start_new_session=True).pid]  # setsid(): a group of its own
    # a daemon: double fork and setsid, its parent gone, so it is no descendant of the worker any more
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            time.sleep(600)
        os._exit(0)
    pids.append(int(os.read(r, 100)))
    open(marker + '.tmp', 'w').write(os.environ.get({tag!r}, 'untagged') + ' ' + ' '.join(map(str, pids)))
    os.rename(marker + '.tmp', marker)
    {tail}
"""


def _read_marker(marker: Path, seconds: float = 60):
    deadline = time.monotonic() + seconds
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), "the target never started"
    tag, *pids = marker.read_text().split()
    return tag, [int(p) for p in pids]


def test_sigkill_of_the_validator_takes_the_target_and_every_process_it_started(tmp_path):
    marker = tmp_path / "pids"
    (tmp_path / "hanger.py").write_text(SPAWNER.format(marker=str(marker), tag=TAG_VAR,
                                                       tail="while True:\n        time.sleep(0.1)"))
    validator = subprocess.Popen([sys.executable, "-m", "pitcheck.cli", "validate", f"{tmp_path / 'hanger.py'}:make",
                                  *TINY_ARGS], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        tag, pids = _read_marker(marker)
        validator.kill()
        validator.wait(timeout=30)
        assert gone_within(pids, 5) == [], f"still running after the validator's SIGKILL: {pids}"
        assert gone_within(tagged(tag), 5) == []  # the guardian too
    finally:
        validator.kill()


def test_setsid_children_and_daemons_do_not_outlive_a_validation_that_ends(tmp_path):
    marker = tmp_path / "pids"
    (tmp_path / "spawner.py").write_text(SPAWNER.format(marker=str(marker), tag=TAG_VAR,
                                                        tail="from pitcheck.nn import make as _make\n"
                                                             "    return _make(V, D, **kw)"))
    result = validate(f"{tmp_path / 'spawner.py'}:make", "float32", checks="bad_input", **TINY)
    assert result.ok, result.fatal or result.table()
    tag, pids = _read_marker(marker, 0)
    assert gone_within(pids, 2) == [] and gone_within(tagged(tag), 2) == []


def test_a_worker_whose_validator_died_before_it_was_tied_exits_at_once(tmp_path):
    # the parent-death signal is set after the worker started; a validator gone by then is seen by its pid
    from pitcheck.verbs.validate import lifeline

    r, w = os.pipe()
    cmd = lifeline.worker_command(str(tmp_path / "request.json"), r)
    assert cmd[4] == str(os.getpid())
    cmd[4] = "1"  # a parent that is not this worker's parent
    start = time.monotonic()
    done = subprocess.run(cmd, pass_fds=(r,), capture_output=True, timeout=60, env=env_with_pitcheck())
    os.close(r), os.close(w)
    assert done.returncode == 1 and time.monotonic() - start < 30
    assert not (tmp_path / "phases.log").exists()  # the target's code never ran


# ---- the pytest plugin's ids ---------------------------------------------------------------------------

def test_the_pytest_plugin_collects_one_item_per_id_when_a_dtype_or_target_is_repeated(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co", "-m", "pitcheck",
                           "--pitcheck", "pitcheck.nn:make", "--pitcheck", "pitcheck.nn:make",
                           "--pitcheck-dtype", "float32,float32, float32", "--pitcheck-checks", "contract,penrose",
                           str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=env_with_pitcheck())
    ids = [ln for ln in proc.stdout.splitlines() if "pitcheck[" in ln]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(ids) == 2 and len(set(ids)) == 2, proc.stdout


def test_a_missing_factory_in_pitchecks_own_checkout_is_named_as_missing(monkeypatch):
    # from the checkout the pitcheck of the working directory is the imported one: no shadowing to report
    monkeypatch.chdir(ROOT)
    result = validate("pitcheck.nn:nosuch", "float32", checks="contract", **TINY)
    assert result.exit_status == 2 and "has no attribute 'nosuch'" in result.fatal, result.fatal
