"""The exact PIT conversion of a tied table and its certificate, on synthetic tables (no optional packages
beyond safetensors for the written file): the float64 bound met by the real conversion and missed by a
planted wrong one, the verb's files, and bad input as one-line errors."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from pitcheck.infra.errors import PitcheckError
from pitcheck.sources.pretrained.certificate import certify, error_bound, measure, verdict
from pitcheck.sources.pretrained.conversion import Conversion, convert_table
from pitcheck.numerics.reference import cholesky_factor, spd_with_condition


def table(vocab=600, dim=24, cond=90.0, seed=0):
    """E0 = P S Q^T with singular values geometric from 500 to 500 / cond."""
    rng = np.random.default_rng(seed)
    P, _ = np.linalg.qr(rng.standard_normal((vocab, dim)))
    Q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    s = 500.0 * cond ** (-np.arange(dim) / (dim - 1))
    return (P * s) @ Q.T


def test_conversion_reproduces_the_table_and_its_pseudo_inverse():
    E0 = table()
    conv = convert_table(E0)
    assert conv.cond == pytest.approx(90.0, rel=1e-9)
    assert np.linalg.norm(conv.Z.T @ conv.Z - np.eye(24)) < 1e-13
    E = conv.Z @ np.linalg.inv(conv.L @ conv.L.T)
    W = (conv.L @ conv.L.T) @ conv.Z.T
    assert np.linalg.norm(E - E0) / np.linalg.norm(E0) < 1e-13
    assert np.linalg.norm(W - np.linalg.pinv(E0)) / np.linalg.norm(np.linalg.pinv(E0)) < 1e-13


def test_certificate_float64_within_its_bound_float32_measured():
    E0 = table()
    conv = convert_table(E0)
    cert = certify(E0, conv, ("float64", "float32"))
    f64, f32 = cert["precisions"]["float64"], cert["precisions"]["float32"]
    assert f64["verdict"] == "pass" and f64["relative_error"] <= f64["bound"] <= 0.1
    assert f64["relative_error_u"] == pytest.approx(f64["relative_error"] / 2.0**-53)
    # a float32 module reproduces E0 to a few u of float32, not of float64
    assert 0.1 < f32["relative_error_u"] < 100 and f32["pinv_drift_u"] < 1e3
    assert cert["cond_E0"] == pytest.approx(90.0, rel=1e-9)


def test_a_wrong_conversion_fails_its_certificate():
    """T = Q S Q^T (S where S^{-1} belongs) gives E != E0: the certificate must say fail, not pass."""
    E0 = table()
    good = convert_table(E0)
    P, s, Qt = np.linalg.svd(E0, full_matrices=False)
    wrong = Conversion(good.Z, cholesky_factor((Qt.T * s) @ Qt), good.singular_values, good.svd_residual,
                       good.p_orthonormality, good.q_orthonormality)
    assert measure(E0, wrong, "float64")["verdict"] == "fail"
    assert measure(E0, good, "float64")["verdict"] == "pass"


def test_bound_grows_with_conditioning_and_a_coarse_bound_is_inconclusive():
    low, high = convert_table(table(cond=10.0)), convert_table(table(cond=1e4))
    assert error_bound(high, "float64") > 100 * error_bound(low, "float64")
    assert verdict(0.01, 0.5) == "inconclusive" and verdict(1e-9, 1e-8) == "pass" and verdict(1e-7, 1e-8) == "fail"


@pytest.mark.parametrize("bad, message", [
    (np.ones((30, 4)), "rank deficient"),
    (np.ones((3, 4)), "cannot have orthonormal columns"),
    (np.full((30, 4), np.nan), "non-finite"),
    (np.ones(30), "2-D"),
])
def test_bad_tables_are_one_line_errors(bad, message):
    with pytest.raises(PitcheckError, match=message):
        convert_table(bad)


def _convert_args(*argv):
    from pitcheck.cli import convert as cli_convert

    parser = argparse.ArgumentParser()
    cli_convert.add_parser(parser.add_subparsers())
    return cli_convert, parser.parse_args(["convert", *argv])


def test_convert_verb_writes_z_l_and_the_certificate(tmp_path, capsys):
    safetensors = pytest.importorskip("safetensors.numpy")
    from pitcheck.sources.pretrained.conversion import read_converted

    E0 = table()
    np.save(tmp_path / "e0.npy", E0)
    cli, args = _convert_args(str(tmp_path / "e0.npy"), "--out", str(tmp_path / "out"), "--dtype", "float64",
                              "--certify", "float64")
    assert cli.main(args) == 0
    assert "pass" in capsys.readouterr().out
    Z, L = read_converted(tmp_path / "out" / "converted.safetensors")
    assert np.linalg.norm(Z @ np.linalg.inv(L @ L.T) - E0) / np.linalg.norm(E0) < 1e-13
    cert = json.loads((tmp_path / "out" / "certificate.json").read_text())
    assert cert["precisions"]["float64"]["verdict"] == "pass" and cert["vocab"] == 600
    assert sorted(safetensors.load_file(str(tmp_path / "out" / "converted.safetensors"))) == ["L", "Z"]
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_convert_verb_refuses_bad_input(tmp_path):
    (tmp_path / "file").write_text("x")
    cli, args = _convert_args(str(tmp_path / "missing.npy"), "--out", str(tmp_path / "o"))
    with pytest.raises(PitcheckError, match="no such file"):
        cli.main(args)
    np.save(tmp_path / "e0.npy", table())
    cli, args = _convert_args(str(tmp_path / "e0.npy"), "--out", str(tmp_path / "file"))
    with pytest.raises(PitcheckError, match="is a file"):
        cli.main(args)
    cli, args = _convert_args(str(tmp_path / "e0.npy"), "--out", str(tmp_path / "o"), "--certify", "float16")
    with pytest.raises(PitcheckError, match="no certificate for dtype"):
        cli.main(args)


def test_gguf_teacher_specs(tmp_path):
    from pitcheck.trajectory.teacher import is_gguf, teacher_shape, teacher_source

    assert teacher_source("m.gguf:token_embd.weight") == ("m.gguf", "token_embd.weight")
    assert is_gguf("m.gguf:token_embd.weight") and not is_gguf("m.npy")
    with pytest.raises(PitcheckError):  # no such file, or (without gguf) the install hint: one line either way
        teacher_shape(str(tmp_path / "missing.gguf:token_embd.weight"))


def test_gguf_teacher_file_is_read_through_gguf_and_converted_exactly(tmp_path):
    gguf = pytest.importorskip("gguf")
    from pitcheck.trajectory.teacher import load_teacher, teacher_shape, teacher_start

    E0 = table(vocab=300, dim=16).astype(np.float32)
    writer = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    writer.add_tensor("token_embd.weight", E0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    spec = f"{tmp_path / 't.gguf'}:token_embd.weight"
    assert teacher_shape(spec) == (300, 16)
    assert np.array_equal(load_teacher(spec), E0.astype(np.float64))
    Z, L = teacher_start(spec, load_teacher(spec))
    assert np.linalg.norm(Z @ np.linalg.inv(L @ L.T) - E0) / np.linalg.norm(E0) < 1e-13
    with pytest.raises(PitcheckError, match="has no tensor 'nope'"):
        teacher_shape(f"{tmp_path / 't.gguf'}:nope")
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(PitcheckError, match="cannot read GGUF file"):
        teacher_shape(f"{tmp_path / 'bad.gguf'}:token_embd.weight")
