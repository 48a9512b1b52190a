"""`pitcheck run --teacher`: a GGUF table starts from its exact PIT form in the conversion mode --teacher-mode
names (keep-embedding by default, E = E0), a .npy table from its polar factor; the manifest records the start's
certificate; the options that contradict a conversion are refused in one line."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pitcheck import cli
from pitcheck.numerics.reference import polar_memory

gguf = pytest.importorskip("gguf")


def table(vocab=200, dim=12, cond=40.0, seed=0):
    """E0 = P S Q^T with singular values geometric from 30 to 30 / cond."""
    rng = np.random.default_rng(seed)
    P, _ = np.linalg.qr(rng.standard_normal((vocab, dim)))
    Q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    return (P * (30.0 * cond ** (-np.arange(dim) / (dim - 1)))) @ Q.T


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A GGUF file holding a float32 tied table, and the table in float64."""
    path = tmp_path_factory.mktemp("teacher") / "t.gguf"
    E0 = table().astype(np.float32)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", E0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return f"{path}:token_embd.weight", E0.astype(np.float64)


def start(run_dir):
    """Z0 and T0 of a --steps 0 run, and its manifest."""
    with np.load(run_dir / "checkpoint.npz") as ck:
        Z, L = ck["Z"], ck["L"]
    return Z, L @ L.T, json.loads((run_dir / "manifest.json").read_text())


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def test_a_gguf_teacher_starts_from_its_keep_embedding_form(teacher, tmp_path):
    spec, E0 = teacher
    assert cli.main(["run", "--teacher", spec, "--steps", "0", "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    Z, T, manifest = start(tmp_path / "r")
    assert rel(np.linalg.solve(T, Z.T).T, E0) < 1e-12  # E = Z T^-1 = E0: not the polar factor with T0 = I
    conversion = manifest["conversion"]
    assert conversion["mode"] == "keep-embedding" and conversion["verdict"] == "pass"
    assert conversion["start_is_conversion"]
    assert manifest["config"].get("teacher_mode", "") == ""  # the default is not written into the config


@pytest.mark.parametrize("mode, exponent", [("keep-head", 1.0), ("balanced", 0.0), ("sqrt", 0.5)])
def test_teacher_mode_sets_t0_to_the_polar_factor_power(teacher, tmp_path, mode, exponent):
    spec, E0 = teacher
    assert cli.main(["run", "--teacher", spec, "--teacher-mode", mode, "--steps", "0",
                     "--out", str(tmp_path / mode), "--no-progress"]) == 0
    Z, T, manifest = start(tmp_path / mode)
    P, s, Qt = np.linalg.svd(E0, full_matrices=False)
    assert rel(Z, P @ Qt) < 1e-12
    assert rel(T, (Qt.T * s**exponent) @ Qt) < 1e-12  # E0 = Z H, T = H^a
    assert manifest["conversion"]["mode"] == mode and manifest["conversion"]["start_is_conversion"]
    assert manifest["config"]["teacher_mode"] == mode


def test_a_table_teacher_starts_from_its_polar_factor(tmp_path):
    E0 = table(vocab=90, dim=6)
    np.save(tmp_path / "t.npy", E0)
    assert cli.main(["run", "--teacher", str(tmp_path / "t.npy"), "--steps", "0", "--out", str(tmp_path / "a"),
                     "--no-progress"]) == 0
    Z, T, manifest = start(tmp_path / "a")
    assert np.array_equal(Z, polar_memory(E0)) and np.array_equal(T, np.eye(6))
    assert manifest["conversion"]["mode"] == "balanced" and manifest["conversion"]["start_is_conversion"]
    # with --cond the start is the polar factor with the run's own T0: no conversion, recorded as none
    assert cli.main(["run", "--teacher", str(tmp_path / "t.npy"), "--cond", "10", "--steps", "0",
                     "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    Z, T, manifest = start(tmp_path / "b")
    assert np.array_equal(Z, polar_memory(E0)) and np.linalg.cond(T) == pytest.approx(10, rel=1e-9)
    assert manifest["conversion"] is None
    # and a run without a teacher has no such entry
    assert cli.main(["run", "--vocab", "64", "--dim", "4", "--steps", "0", "--out", str(tmp_path / "c"),
                     "--no-progress"]) == 0
    assert "conversion" not in start(tmp_path / "c")[2]


@pytest.mark.parametrize("extra, message", [
    (["--teacher-mode", "keep-embedding-scaled"], "logit scale outside PIT"),
    (["--teacher-mode", "nope"], "unknown --teacher-mode 'nope'; choose from keep-embedding, keep-head, balanced, sqrt"),
    (["--cond", "10"], "--cond 10 sets T0, which the teacher's conversion (keep-embedding) fixes"),
    (["--head", "tied", "--teacher-mode", "sqrt"], "--teacher-mode only make sense with --head pit"),
])
def test_options_that_contradict_the_conversion_are_refused(teacher, tmp_path, capsys, extra, message):
    spec, _ = teacher
    assert cli.main(["run", "--teacher", spec, *extra, "--steps", "0", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_teacher_mode_without_a_teacher_is_refused(tmp_path, capsys):
    assert cli.main(["run", "--teacher-mode", "sqrt", "--steps", "0", "--out", str(tmp_path / "r")]) == 2
    assert "give --teacher" in capsys.readouterr().err


def test_a_teacher_run_resumes_only_in_its_mode(teacher, tmp_path, capsys):
    spec, _ = teacher

    def args(mode, steps, *more):
        return ["run", "--teacher", spec, "--teacher-mode", mode, "--steps", str(steps), "--out", str(tmp_path / "r"),
                "--no-progress", *more]

    assert cli.main(args("sqrt", 4)) == 0
    assert cli.main(args("sqrt", 8, "--resume")) == 0
    capsys.readouterr()
    assert cli.main(args("keep-head", 12, "--resume")) == 2
    err = capsys.readouterr().err
    assert "teacher_mode" in err and "sqrt" in err


def test_a_resume_compares_the_start_the_mode_resolves_to(teacher, tmp_path, capsys):
    import hashlib

    spec, _ = teacher
    out = tmp_path / "r"

    def args(steps, *more):
        return ["run", "--teacher", spec, "--steps", str(steps), "--out", str(out), "--no-progress", *more]

    # the default given by name is the same start
    assert cli.main(args(4)) == 0
    assert cli.main(args(8, "--resume", "--teacher-mode", "keep-embedding")) == 0
    # a directory of a pitcheck from before the modes: its GGUF teacher started at the polar factor, T0 = I
    assert cli.main(args(4, "--force", "--teacher-mode", "balanced")) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["conversion"], manifest["config"]["teacher_mode"]
    data = (json.dumps(manifest, indent=1) + "\n").encode()
    (out / "manifest.json").write_bytes(data)
    record = json.loads((out / "commit.json").read_text())
    record["files"]["manifest.json"] = hashlib.sha256(data).hexdigest()
    (out / "commit.json").write_text(json.dumps(record))
    capsys.readouterr()
    assert cli.main(args(8, "--resume")) == 2  # the default now would be keep-embedding's start
    err = capsys.readouterr().err
    assert "teacher_mode='balanced'" in err and "resume it with --teacher-mode balanced" in err
    assert cli.main(args(8, "--resume", "--teacher-mode", "balanced")) == 0
    assert json.loads((out / "manifest.json").read_text())["conversion"]["mode"] == "balanced"
