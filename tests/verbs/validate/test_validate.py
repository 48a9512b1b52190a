"""`pitcheck validate` end to end: the reference module and correct zoo implementations pass, each broken
one fails with the right check named, and a target that hangs, aborts or cannot be imported ends with
exit status 2 within the timeout. Targets run in a child process, as users' targets do."""
import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pitcheck.cli import main
from pitcheck.infra.errors import PitcheckError
from pitcheck.verbs.validate import TAU, validate
from tests.zoo import CAUGHT_BY, NOT_SHOWN, OPTIONAL

SMALL = dict(vocab=128, dim=8, steps=40, timeout=240)

# the sizes where a bug shows, where the small default does not
SIZES = {
    # torch.linalg.pinv's default cutoff V eps drops a direction once cond(T) > 1 / (V eps): V = 1024
    "broken_pinv_head": {"vocab": 1024},
}
BROKEN = {name: (check, SIZES.get(name, {})) for name, check in CAUGHT_BY.items()
          if name.startswith("broken_") and name != "broken_fp32_solves" and name not in OPTIONAL}
CORRECT = ["correct_cholesky_qr", "correct_upper_polar", "correct_eigen", "correct_cayley", "correct_cayley_canonical"]


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan may wait for a reaper that this sandbox's init is not)."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def run_zoo(name, dtype, **over):
    return validate(f"tests.zoo.{name}:make", dtype, **{**SMALL, **over})


def assert_clean(result):
    assert result.exit_status == 0, result.table()
    assert not result.fatal and not result.failed()


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_implementation_fails_its_check_in_float32(name):
    check, sizes = BROKEN[name]
    result = run_zoo(name, "float32", checks=[check], **sizes)
    assert result.exit_status == 1 and result.failed() == [check], result.table()
    assert result.by_name()[check].reason


@pytest.mark.parametrize("name", CORRECT)
def test_correct_conventions_pass_every_check_in_float32(name):
    assert_clean(run_zoo(name, "float32"))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_correct_module_started_at_cond_1e4_passes_every_check(dtype):
    # a verifier that rebuilds T through W W^T squares cond(T): 214 units off in float64 here
    result = run_zoo("correct_conditioned_start", dtype, vocab=512, dim=16)
    assert_clean(result)
    assert result.by_name()["reference"].value < 4, result.table()


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_reference_module_passes_its_own_validator(dtype):
    result = validate("pitcheck.nn:make", dtype, **SMALL)
    assert_clean(result)
    # passing means resolved: in float64 and float32 nothing may hide behind 'inconclusive'
    if dtype != "bfloat16":
        assert [c.verdict for c in result.checks] == ["pass"] * len(result.checks), result.table()


def test_reference_module_passes_the_gradients_check_in_bfloat16_at_the_default_size():
    # V = 2048, D = 32, seed 0: the random direction is nearly orthogonal to the gradient (sum |g_i d_i| is
    # 8450 x |sum g_i d_i|), which made the bfloat16 derivative's relative error 40 x the unit before the
    # difference was taken relative to sum |g_i d_i|; the per-parameter gradients measure ~0.5 units
    result = validate("pitcheck.nn:make", "bfloat16", checks=["gradients"])
    check = result.by_name()["gradients"]
    assert check.verdict == "pass" and check.value < 2, result.table()
    rows = {d["state"]: d for d in check.details}
    assert {d["verdict"] for d in rows.values()} == {"pass"}, check.details
    assert {"bfloat16 vs float64 gradient of Z", "bfloat16 vs float64 gradient of L_raw"} <= set(rows)


# wrong backwards planted in pitcheck.nn.PIT: under bfloat16 only (so the float64 build, whose autograd the
# bfloat16 one is compared with, is right) or in every build (float32 is judged by its own differences)
PLANTED_BACKWARD = {
    # every parameter's gradient 1.5 x (50 %: 87 units in bfloat16 at cond(T) 1.47)
    "scaled": "        for p in self.parameters():\n"
              "            p.register_hook(lambda g: {scale} * g)\n",
    # the head's dense gradient into the memory dropped (Z detached in logits)
    "missing_term": "        inner = self._memory\n"
                    "        self._memory = lambda z: inner(z.detach() if z is self.Z else z)\n",
}


# float32 is judged by its finite differences, whose measured noise at the generic state depends on the
# rounding of the steps that reach it: 0.07 % of the derivative at 4aa1346's, 0.44 % once `qr` formed Q as
# Y R^{-1} at 2048 x 32. A 5 % error is then 30 or 9 noise units (a pass below 16): the check
# resolves errors above 16 x its measured noise, and says which noise it was. 25 %: 64 and 43 units.
@pytest.mark.parametrize("dtype,bug,scale", [("bfloat16", "scaled", 1.5), ("bfloat16", "missing_term", None),
                                             ("float32", "scaled", 1.25), ("float32", "missing_term", None)])
def test_a_planted_wrong_backward_fails_the_gradients_check_at_the_default_size(tmp_path, dtype, bug, scale):
    only_half = dtype == "bfloat16"
    (tmp_path / "planted.py").write_text(
        "from pitcheck.nn import HALF, PIT\n"
        "class Planted(PIT):\n"
        "    def __init__(self, *a, **kw):\n"
        "        super().__init__(*a, **kw)\n"
        f"        if {only_half} and self.dtype not in HALF:\n"
        "            return\n" + PLANTED_BACKWARD[bug].format(scale=scale) +
        "def make(V, D, **kw):\n"
        "    return Planted(V, D, **kw)\n")
    result = validate(f"{tmp_path / 'planted.py'}:make", dtype, checks=["gradients"])
    assert result.failed() == ["gradients"], result.table()
    failed = [d["state"] for d in result.by_name()["gradients"].details if d["verdict"] == "fail"]
    if only_half:  # the float64 build is right: the per-parameter comparison is what sees it
        assert failed and all(" gradient of " in s for s in failed), failed
    else:
        # the wrong gradient named by its parameter and its map: the memory's through the head when the
        # head's term is dropped; every gradient when all are scaled
        named = {"missing_term": ["gradient of Z through logits"],
                 "scaled": [f"gradient of {p} through {m}" for p in ("Z", "L_raw") for m in ("embed", "logits")]}
        assert failed == ["autograd vs finite differences (float32)", *named[bug]], failed


def test_a_bfloat16_parameter_in_the_float64_build_limits_the_finite_differences():
    # broken_bf16_storage keeps Z in bfloat16 whatever it is asked; under a bfloat16 request its autograd is
    # right, but differences shifted onto a bfloat16 Z cannot check it: inconclusive, not a false failure
    result = run_zoo("broken_bf16_storage", "bfloat16", checks=["gradients"])
    check = result.by_name()["gradients"]
    assert check.verdict == "inconclusive" and "bfloat16 cannot resolve" in check.reason, result.table()


def test_pitcheck_validate_is_callable_after_a_bare_import():
    code = ("import sys, pitcheck\n"
            "assert 'torch' not in sys.modules\n"
            "ok = pitcheck.validate('tests.zoo.correct_cayley:make', 'float32', vocab=64, dim=4, checks=['penrose'])\n"
            "bad = pitcheck.validate('tests.zoo.broken_one_solve:make', 'float32', vocab=64, dim=4, checks=['penrose'])\n"
            "print(ok.exit_status, bad.exit_status, bad.failed())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.stdout.strip() == "0 1 ['penrose']", done.stdout + done.stderr


def test_state_outside_the_state_dict_is_the_checkpoint_checks_failure_not_the_gradients():
    # broken_checkpoint keeps Z outside parameters and state_dict: under a bfloat16 request the float64 build
    # cannot be put at the same point, so the two autograds are not compared (inconclusive, with the reason)
    result = run_zoo("broken_checkpoint", "bfloat16", checks=["gradients", "checkpoint"])
    assert result.failed() == ["checkpoint"], result.table()
    assert "state outside the state_dict" in result.by_name()["gradients"].reason


def test_float32_solves_under_a_float64_request_fail_the_contract():
    result = run_zoo("broken_fp32_solves", "float64", checks=["contract"])
    assert result.failed() == ["contract"] and "float32" in result.by_name()["contract"].reason


# bfloat16 resolves judgements only at cond(T) <= 1.44 (TAU unit(cond) <= 0.1), so some bugs show through
# a different check, at a larger size or not at all (tests.zoo.NOT_SHOWN says why). The probes' steps (SGD at
# 1e-2, gradients scaled to norm 1: the parameters move 0.01 a step), so a bug whose error is a few steps' movement
# measures ~0.01 (2.5 bfloat16 units, 3e4 float32 units), far below bfloat16's threshold of 16 units (0.0625):
# - broken_no_retraction: ||Z^T Z - I||_2 0.0097 after 40 steps (2.4 units); at the default 200 steps the 1 %
#   spikes of 100x (step 94 at seed 0) take it to 0.35 (64 units): tested at 200 steps;
# - broken_stale_cache: the embedding lags the head by at most 4 steps, 0.0094 at penrose's own steps (2.4 units),
#   at most 2.6 units along 200 steps; its cache is also outside the state_dict, which `checkpoint` resolves
#   in bfloat16 (embedding 1.44 off after a resume, 370 units).
# At 40 steps both fail through their float64 build, which shows the defect (checks.judge_shadow), tested
# below; so do broken_transposed and broken_jittered_inverse, whose errors lie below bfloat16's threshold too.
BROKEN_BF16 = {**{k: v for k, v in BROKEN.items() if ("bfloat16", k) not in NOT_SHOWN},
               "broken_no_retraction": ("trajectory", {"steps": 200}),
               "broken_stale_cache": ("checkpoint", {})}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BROKEN_BF16))
def test_broken_implementation_fails_its_check_in_bfloat16(name):
    check, sizes = BROKEN_BF16[name]
    result = run_zoo(name, "bfloat16", checks=[check], **sizes)
    assert result.failed() == [check], result.table()


@pytest.mark.parametrize("name,check", [("broken_no_retraction", "trajectory"), ("broken_stale_cache", "trajectory"),
                                        ("broken_stale_cache", "penrose")])
def test_a_defect_below_bfloat16s_threshold_fails_through_the_float64_build(name, check):
    # ~2.5 bfloat16 units at 40 steps (a pass by bfloat16's own measurement) while the float64 build of the
    # same code, taken through the same steps, is 5e3-4e4 float32 units off: the code is wrong, so a failure
    result = run_zoo(name, "bfloat16", checks=[check])
    c = result.by_name()[check]
    assert c.verdict == "fail" and "the float64 build of the target" in c.reason, result.table()
    assert "a defect of the code" in c.reason
    own = [d["ratio"] for d in c.details if "ratio" in d]
    assert own and 1 < max(own) < TAU  # what bfloat16 itself measured: above its unit, below its threshold
    worst = max(d["ratio_build_units"] for d in c.details if "ratio_build_units" in d)
    assert worst > 1e3, c.details


@pytest.mark.parametrize("target", ["pitcheck.nn:make", "tests.zoo.correct_cholesky_qr:make"])
def test_a_correct_module_still_passes_penrose_and_trajectory_in_bfloat16_beside_its_float64_build(target):
    result = validate(target, "bfloat16", checks=["penrose", "trajectory"], **SMALL)
    for c in result.checks:
        assert c.verdict == "pass", result.table()
        ratios = [d["ratio_build_units"] for d in c.details if "ratio_build_units" in d]
        assert ratios and max(ratios) < 1, c.details  # measured 0.12: the float32 master the build starts from


@pytest.mark.slow
@pytest.mark.parametrize("name", CORRECT)
def test_correct_conventions_pass_in_bfloat16(name):
    assert_clean(run_zoo(name, "bfloat16"))


# ---- targets that cannot be run ------------------------------------------------------------------

@pytest.mark.parametrize("name,phase", [("hang", "timed out after 6 s during build"),
                                        ("abort", "killed by SIGABRT during build"),
                                        ("unimportable", "cannot import")])
def test_a_target_that_hangs_aborts_or_cannot_be_imported_is_exit_2(name, phase, capsys):
    start = time.monotonic()
    status = main(["validate", f"tests.zoo.{name}:make", "--vocab", "64", "--dim", "4", "--timeout", "6"])
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and elapsed < 6 + 10
    assert len(err) == 1 and phase in err[0]


@pytest.mark.parametrize("signame,status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_interrupting_the_validator_kills_the_target(tmp_path, signame, status):
    # Ctrl-C or a cancelled CI job (SIGTERM) while the target hangs must not orphan the target
    marker = tmp_path / "pid"
    (tmp_path / "sleeper.py").write_text(
        "import os, time\n"
        f"def make(V, D, **kw):\n    open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
        "    while True:\n        time.sleep(0.1)\n")
    proc = subprocess.Popen([sys.executable, "-m", "pitcheck.cli", "validate", f"{tmp_path / 'sleeper.py'}:make",
                             "--vocab", "64", "--dim", "4", "--timeout", "120"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists()
    target_pid = int(marker.read_text())
    proc.send_signal(getattr(__import__("signal"), signame))
    assert proc.wait(timeout=30) == status
    if signame == "SIGINT":
        assert proc.stderr.read().strip().splitlines() == ["pitcheck: interrupted"]
    time.sleep(0.5)
    assert not running(target_pid)


def test_children_the_target_started_do_not_outlive_the_validation(tmp_path):
    marker = tmp_path / "child"
    (tmp_path / "forker.py").write_text(
        "import subprocess\nfrom pitcheck.nn import make as _make\n"
        "def make(V, D, **kw):\n"
        "    child = subprocess.Popen(['sleep', '600'])\n"
        f"    open({str(marker)!r}, 'a').write(str(child.pid) + '\\n')\n"
        "    return _make(V, D, **kw)\n")
    result = validate(f"{tmp_path / 'forker.py'}:make", "float32", checks="bad_input", **SMALL)
    assert result.exit_status == 0
    time.sleep(0.5)
    assert not any(running(pid) for pid in map(int, marker.read_text().split()))


BATCH_BUGS = {
    # a (B, T, D) "fast path" in the head that gives every sequence the logits of sequence 0
    "logits_first_sequence": "    inner = m.logits\n"
                             "    m.logits = lambda h: inner(h) if h.dim() < 3 else inner(h[:1]).expand(h.shape[0], *inner(h[:1]).shape[1:])\n",
    # (B, T) ids embedded in column-major order
    "embed_column_major": "    inner = m.embed\n"
                          "    m.embed = lambda ids: inner(ids) if ids.dim() < 2 else inner(ids.T.reshape(-1)).reshape(*ids.shape, -1)\n",
}


@pytest.mark.parametrize("bug", sorted(BATCH_BUGS))
def test_maps_applied_to_batches_of_sequences_are_checked(tmp_path, bug):
    (tmp_path / "batched.py").write_text(
        "from pitcheck.nn import make as _make\n"
        "def make(V, D, **kw):\n"
        "    m = _make(V, D, **kw)\n" + BATCH_BUGS[bug] + "    return m\n")
    result = validate(f"{tmp_path / 'batched.py'}:make", "float32", checks="reference", **{**SMALL, "steps": 1})
    assert result.failed() == ["reference"] and "(B, T) batches" in result.by_name()["reference"].reason


def test_a_thread_the_target_leaves_running_does_not_hang_the_end(tmp_path):
    (tmp_path / "threads.py").write_text(
        "import threading, time\nfrom pitcheck.nn import make as _make\n"
        "def make(V, D, **kw):\n"
        "    threading.Thread(target=time.sleep, args=(10**6,)).start()\n"
        "    return _make(V, D, **kw)\n")
    result = validate(f"{tmp_path / 'threads.py'}:make", "float32", checks="bad_input", **{**SMALL, "timeout": 60})
    assert result.exit_status == 0 and not result.fatal and result.seconds < 60


def test_an_optimizer_that_is_not_one_is_a_target_error(tmp_path):
    (tmp_path / "noopt.py").write_text(
        "from pitcheck.nn import make as _make\n"
        "def make(V, D, **kw):\n"
        "    m = _make(V, D, **kw)\n"
        "    m.configure_optimizer = lambda params: None\n"
        "    return m\n")
    result = validate(f"{tmp_path / 'noopt.py'}:make", "float32", checks="trajectory", **SMALL)
    assert result.exit_status == 2 and "configure_optimizer returned NoneType" in result.fatal


def test_a_target_file_may_share_a_name_with_a_library_module(tmp_path):
    (tmp_path / "json.py").write_text("from pitcheck.nn import make\n")
    result = validate(f"{tmp_path / 'json.py'}:make", "float32", checks="contract", **SMALL)
    assert result.exit_status == 0, result.fatal


def test_a_target_that_raises_in_a_check_fails_that_check(tmp_path, monkeypatch):
    (tmp_path / "raiser.py").write_text(
        "from pitcheck.nn import make as _make\n"
        "def make(V, D, **kw):\n"
        "    m = _make(V, D, **kw)\n"
        "    def boom(ids):\n"
        "        raise RuntimeError('fused kernel missing')\n"
        "    m.embed = boom\n"
        "    return m\n")
    result = validate(f"{tmp_path / 'raiser.py'}:make", "float32", checks="penrose", **{**SMALL, "steps": 1})
    assert result.exit_status == 1
    assert "RuntimeError: fused kernel missing" in result.by_name()["penrose"].reason
    assert "raiser.py" in result.by_name()["penrose"].reason


@pytest.mark.parametrize("argv,message", [
    (["nosuch_module:make"], "cannot import"),
    (["pitcheck.nn:nosuch"], "has no attribute"),
    (["not a target"], "not of the form"),
    (["pitcheck.nn:make", "--checks", "penrose,bogus"], "unknown check bogus"),
    (["pitcheck.nn:make", "--vocab", "8", "--dim", "8"], "at least 2 x --dim"),
    (["pitcheck.nn:make", "--steps", "-1"], "--steps must be"),
    (["pitcheck.nn:make", "--timeout", "nan"], "--timeout must be"),
    pytest.param(["pitcheck.nn:make", "--device", "cuda"], "no CUDA device",
                 marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is present")),
])
def test_bad_validate_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(["validate", *argv]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    if argv[0] == "pitcheck.nn:make":  # a bad option is refused before the banner says the target is validated
        assert captured.out == "", captured.out


@pytest.mark.parametrize("option", ["--json", "--report", "--junit"])
def test_an_output_naming_the_targets_source_is_refused_before_validating(tmp_path, monkeypatch, option, capsys):
    zoo = Path(__file__).parents[2] / "zoo" / "correct_cholesky_qr.py"
    code = zoo.read_text()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise RuntimeError('a package __init__ must not run here')\n")
    (tmp_path / "pkg" / "mine.py").write_text(code)
    (tmp_path / "mypit.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    for target, output in (("mypit.py:make", "./mypit.py"), (f"{tmp_path / 'mypit.py'}:make", "mypit.py"),
                           ("pkg.mine:make", "pkg/mine.py")):
        assert main(["validate", target, option, output, "--checks", "contract"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "the target's source file: name another file" in err[0], err
    assert (tmp_path / "mypit.py").read_text() == code and (tmp_path / "pkg" / "mine.py").read_text() == code


def test_target_source_finds_the_file_without_running_it(tmp_path, monkeypatch):
    from pitcheck.verbs.validate.target import target_source

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "__init__.py").write_text("raise SystemExit('ran')\n")
    (tmp_path / "a" / "b" / "c.py").write_text("")
    assert target_source("a.b.c:make") == tmp_path / "a" / "b" / "c.py"  # a/b: a namespace package
    assert target_source("a:make") == tmp_path / "a" / "__init__.py"
    assert target_source("pitcheck.nn:make") == Path(__import__("pitcheck.nn").nn.__file__)
    for none in ("a.nope:make", "nope:make", "x.py:make", "not a target", len):
        assert target_source(none) is None


@pytest.mark.parametrize("option", ["--json", "--report", "--junit"])
def test_unwritable_output_paths_are_refused_before_validating(tmp_path, option, capsys):
    for path, message in ((tmp_path, "is a directory"), (tmp_path / "missing" / "r.out", "does not exist")):
        assert main(["validate", "pitcheck.nn:make", option, str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0]


def test_python_api_rejects_bad_options():
    with pytest.raises(PitcheckError, match="unknown dtype"):
        validate("pitcheck.nn:make", "float8")


# ---- outputs ---------------------------------------------------------------------------------------

def test_cli_writes_the_same_result_as_json_markdown_and_junit(tmp_path, capsys):
    paths = {k: tmp_path / f"r.{k}" for k in ("json", "md", "xml")}
    status = main(["validate", "tests.zoo.broken_one_solve:make", "--vocab", "128", "--dim", "8", "--steps", "20",
                   "--checks", "contract,penrose", "--json", str(paths["json"]), "--report", str(paths["md"]),
                   "--junit", str(paths["xml"])])
    out = capsys.readouterr().out
    assert status == 1
    assert "penrose" in out and "1 of 2 checks failed" in out
    data = json.loads(paths["json"].read_text())
    assert data["exit_status"] == 1 and [c["verdict"] for c in data["checks"]] == ["pass", "fail"]
    assert "| penrose | fail |" in paths["md"].read_text()
    suite = ET.parse(paths["xml"]).getroot().find("testsuite")
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    assert [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None] == ["penrose"]


def test_a_factory_object_that_cannot_be_imported_by_name_runs_in_process():
    from pitcheck.model.nn import make

    def local_factory(V, D, **kw):
        return make(V, D, **kw)

    result = validate(local_factory, "float32", checks="penrose,bad_input", **SMALL)
    assert result.exit_status == 0 and result.target.endswith("local_factory")


def test_huggingface_model_is_adapted_and_standard_tying_fails_penrose():
    pytest.importorskip("transformers")
    result = run_zoo("hf_tied_gpt2", "float32", checks="contract,penrose")
    assert not result.fatal, result.fatal
    assert result.by_name()["contract"].verdict == "pass"
    assert result.failed() == ["penrose"]


def test_pytest_plugin_adds_one_item_per_check_with_xfail_reasons(tmp_path):
    xfail = tmp_path / "xfail.txt"
    xfail.write_text("penrose  # known: one solve\n")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "pitcheck", "-rA",
           "--pitcheck", "tests.zoo.broken_one_solve:make", "--pitcheck-checks", "contract,penrose,reference",
           "--pitcheck-vocab", "128", "--pitcheck-dim", "8", "--pitcheck-steps", "5",
           "--pitcheck-xfail", str(xfail), "--junitxml", str(tmp_path / "j.xml"), __file__]
    # __file__: what pytest collects beside the plugin's items (deselected by -m pitcheck); without a path
    # it would import every module of tests/ and stress/ first, most of this test's time
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "PASSED" in out and "pitcheck[tests.zoo.broken_one_solve:make-float32-contract]" in out
    assert "XFAIL" in out and "known: one solve" in out
    assert "FAILED" in out and "pitcheck[tests.zoo.broken_one_solve:make-float32-reference]" in out
    assert "1 failed, 1 passed" in out and "1 xfailed" in out


@pytest.mark.parametrize("args,message", [
    (["--pitcheck-dtype", "float8"], "unknown dtype"),
    (["--pitcheck-dtype", ","], "names no dtype"),
    (["--pitcheck-timeout", "0"], "--timeout must be"),
    (["--pitcheck-xfail", "BINARY"], "not a UTF-8 text file"),
    (["--pitcheck-xfail", "TYPO"], "penrsoe names no selected check"),
])
def test_pytest_plugin_refuses_bad_options_as_usage_errors(tmp_path, args, message):
    (tmp_path / "BINARY").write_bytes(b"\xff\xfe\x00penrose")
    (tmp_path / "TYPO").write_text("penrsoe  # typo\n")
    args = [str(tmp_path / a) if a in ("BINARY", "TYPO") else a for a in args]
    # the plugin refuses after collection: __file__ keeps that to one module, not all of tests/ and stress/
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "pitcheck",
                           "--pitcheck", "pitcheck.nn:make", *args, __file__], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr + proc.stdout


def test_pytest_plugin_is_inert_without_the_option():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co", "-m", "pitcheck",
                           str(Path(__file__).with_name("test_validate_checks.py"))], capture_output=True, text=True, timeout=120)
    assert "no tests collected" in proc.stdout or "deselected" in proc.stdout
    assert "pitcheck[" not in proc.stdout


# ---- 8- and 4-bit storage ---------------------------------------------------------------------------

def test_a_block_scaled_wrapper_reporting_float32_fails_the_contract():
    """torchao's MXTensor says dtype float32 while it holds E4M3 elements: the contract looks inside."""
    pytest.importorskip("torchao", reason="torchao (the MX reference) is not installed")
    result = run_zoo("broken_mx_storage", "float32", checks=["contract"])
    assert result.failed() == ["contract"], result.table()
    assert "float8_e4m3fn elements inside a MXTensor reporting float32" in result.by_name()["contract"].reason


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2"])
def test_validating_in_an_8_or_4_bit_dtype_is_refused_with_the_reason(dtype, capsys):
    from pitcheck.infra.errors import PitcheckError

    with pytest.raises(PitcheckError, match=r"16 u\) larger than 0.1"):
        validate("tests.zoo.correct_cayley:make", dtype, **SMALL)
    assert main(["validate", "tests.zoo.correct_cayley:make", "--dtype", dtype]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"validate does not run in {dtype}" in err


# ---- true reasons: storage rounding, the memory measured itself, narrow copies --------------------------

@pytest.mark.parametrize("factory", ["make", "make_frozen"])
def test_a_module_storing_its_memory_in_bfloat16_is_not_called_defective_by_its_float64_build(factory):
    # loaded from the bfloat16 state, the float64 build's memory is bfloat16-rounded (||Z^T Z - I||_2 ~ 6e-4):
    # that is storage rounding, taken back to the manifold before the build's first step, not a defect.
    # The frozen memory (PIT's first version) is never retracted by the module itself.
    result = validate(f"tests.zoo.correct_half_storage:{factory}", "bfloat16", checks=["penrose", "trajectory"],
                      **SMALL)
    for c in result.checks:
        assert c.verdict == "pass", result.table()
        ratios = [d["ratio_build_units"] for d in c.details if "ratio_build_units" in d]
        assert ratios and max(ratios) < 1, c.details


def test_a_defect_of_the_maps_is_shown_by_the_float64_build_and_not_blamed_on_the_memory():
    # E = Z (T^-1 + 1e-4 I): 1e-4 is below bfloat16's threshold, ~400 float32 units in the float64 build,
    # which fails the check though bfloat16's own measurement cannot see it
    half = run_zoo("broken_jittered_inverse", "bfloat16", checks=["penrose"]).by_name()["penrose"]
    assert half.verdict == "fail" and "a defect of the code, not rounding" in half.reason, half.reason
    # in float32 the trajectory measures Z itself (exactly orthonormal after QR) beside the maps' W E - I
    check = run_zoo("broken_jittered_inverse", "float32", checks=["trajectory"]).by_name()["trajectory"]
    assert check.verdict == "fail" and "penrose residual (with Z itself" in check.reason, check.reason
    assert "memory orthonormality" not in check.reason
    memory_rows = [d for d in check.details if d["measure"].startswith("memory orthonormality")]
    assert memory_rows and all(d["verdict"] == "pass" for d in memory_rows)
    assert max(d["maps_orthonormality"] for d in memory_rows) > 5e-5  # what W E alone would have suggested


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_float8_copy_of_the_memory_that_the_maps_do_not_read_passes(dtype):
    # an E4M3 cast cache of Z (FP8 recipes keep one for a float8 GEMM): no probe may stop on it, and contract
    # fails only narrow tensors the maps read (broken_fp8_storage's Z8 still fails)
    result = run_zoo("correct_fp8_copy", dtype)
    assert_clean(result)
    contract = result.by_name()["contract"]
    assert any("neither map reads it" in d.get("reason", "") for d in contract.details)
    broken = run_zoo("broken_fp8_storage", dtype, checks=["contract"])
    assert broken.failed() == ["contract"] and "Z8" in broken.by_name()["contract"].reason


def test_a_wrong_backward_of_the_embedding_is_named_by_map_and_parameter():
    # broken_backward's hand-written solve backward transposes T^-1: the embedding's gradients into both Z
    # and L are wrong, the head's are right
    check = run_zoo("broken_backward", "float32", checks=["gradients"]).by_name()["gradients"]
    failed = {d["state"] for d in check.details if d["verdict"] == "fail"}
    assert {"gradient of Z through embed", "gradient of L_raw through embed"} <= failed, failed
    assert not any("through logits" in s for s in failed), failed
    assert "gradient of Z through embed" in check.reason
