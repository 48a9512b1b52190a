"""Conversion modes on small exact cases (random V x D tables, float64 and float32): each mode's identity
through the reference module's own embed and logits paths, against an independent SVD; each certificate's
figures within their bounds and judged only where the mode aims; the logit scale's 1-D fit; the verb's
files; a run's start certificate (the teacher hook)."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pitcheck.infra.errors import PitcheckError  # noqa: E402
from pitcheck.sources.pretrained.certificate import certify, certify_start, measure  # noqa: E402
from pitcheck.sources.pretrained.conversion import MODES, Conversion, convert_table, get_mode  # noqa: E402
from pitcheck.sources.pretrained.pit_module import pit_from  # noqa: E402
from pitcheck.sources.pretrained.scale import fit_logit_scale, loss_slope, scaled_loss  # noqa: E402
from pitcheck.numerics.reference import cholesky_factor  # noqa: E402

U = {"float64": 2.0**-53, "float32": 2.0**-24}
SCALE = 3.7


def table(vocab=300, dim=16, cond=60.0, seed=0):
    """E0 = P S Q^T with singular values geometric from 40 to 40 / cond."""
    rng = np.random.default_rng(seed)
    P, _ = np.linalg.qr(rng.standard_normal((vocab, dim)))
    Q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    return (P * (40.0 * cond ** (-np.arange(dim) / (dim - 1)))) @ Q.T


def oracle(E0):
    """Z = P Q^T and H = Q S Q^T from numpy's SVD: E0 = Z H."""
    P, s, Qt = np.linalg.svd(E0, full_matrices=False)
    return P @ Qt, Qt.T, s, P


def maps(conv, dtype):
    """(E, W) as the reference module computes them in `dtype`: E its embedding of every row, W = s T Z^T its
    logits of the identity (the head's D x V matrix), s the mode's logit scale."""
    module = pit_from(conv.Z, conv.L, dtype=getattr(torch, dtype))
    with torch.no_grad():
        E = module.embed(torch.arange(conv.Z.shape[0])).to(torch.float64).numpy()
        W = module.logits(torch.eye(conv.Z.shape[1], dtype=getattr(torch, dtype))).to(torch.float64).numpy()
    return E, conv.scale * W


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def converted(E0, mode):
    return convert_table(E0, mode, SCALE if get_mode(mode).scaled else None)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_keep_embedding_keeps_e0_and_its_head_is_the_pseudo_inverse(dtype):
    E0 = table()
    E, W = maps(convert_table(E0, "keep-embedding"), dtype)
    assert rel(E, E0) < 200 * U[dtype]
    assert rel(W, np.linalg.pinv(E0)) < 200 * U[dtype] * 60
    assert np.linalg.norm(W @ E - np.eye(16)) < 200 * U[dtype] * 60


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_keep_head_keeps_e0_transposed(dtype):
    E0 = table()
    E, W = maps(convert_table(E0, "keep-head"), dtype)
    assert rel(W, E0.T) < 200 * U[dtype]
    assert rel(E, np.linalg.pinv(E0).T) < 200 * U[dtype] * 60  # Z H^-1 = P S^-1 Q^T
    assert np.linalg.norm(W @ E - np.eye(16)) < 200 * U[dtype] * 60


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_balanced_is_the_polar_factor_both_ways(dtype):
    E0 = table()
    Z, _, _, _ = oracle(E0)
    conv = convert_table(E0, "balanced")
    assert np.array_equal(conv.L, np.eye(16))
    E, W = maps(conv, dtype)
    assert rel(E, Z) < 200 * U[dtype] and rel(W, Z.T) < 200 * U[dtype]
    assert np.linalg.norm(E.T @ E - np.eye(16)) < 200 * U[dtype]
    assert np.linalg.norm(W @ E - np.eye(16)) < 200 * U[dtype]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_sqrt_takes_the_square_root_of_h(dtype):
    E0 = table()
    _, Q, s, P = oracle(E0)
    E, W = maps(convert_table(E0, "sqrt"), dtype)
    assert rel(W, (Q * np.sqrt(s)) @ P.T) < 200 * U[dtype] * 8  # H^1/2 Z^T
    assert rel(E, (P / np.sqrt(s)) @ Q.T) < 200 * U[dtype] * 8  # Z H^-1/2
    assert np.linalg.norm(W @ E - np.eye(16)) < 200 * U[dtype] * 8


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_keep_embedding_scaled_ties_up_to_the_scale(dtype):
    """E = E0, and the head as the study's PIT head applies it (logits s (h T) Z^T): W E = s I, W = s pinv(E0)."""
    from pitcheck.sources.pretrained.body import make_head

    E0 = table()
    conv = convert_table(E0, "keep-embedding-scaled", SCALE)
    head = make_head("pit", E0, conversion=conv, dtype=getattr(torch, dtype))
    assert head.scale() == pytest.approx(SCALE, rel=1e-6)
    with torch.no_grad():
        E = head.embed(torch.arange(300)).to(torch.float64).numpy()
        W = head.logits(torch.eye(16)).to(torch.float64).numpy()
    tol = 200 * max(U[dtype], 2.0**-24)  # the head hands its embedding and logits to the body in float32
    assert rel(E, E0) < tol
    assert rel(W, SCALE * np.linalg.pinv(E0)) < tol * 60
    assert np.linalg.norm(W @ E - SCALE * np.eye(16)) / SCALE < tol * 60
    assert np.linalg.norm(W @ E - np.eye(16)) > 1  # not the plain tie


@pytest.mark.parametrize("mode", list(MODES))
def test_each_certificate_within_its_bounds_and_judged_only_where_the_mode_aims(mode):
    E0 = table()
    conv = converted(E0, mode)
    cert = certify(E0, conv, ("float64", "float32"))
    assert cert["mode"] == mode and cert["cond_T"] == pytest.approx(60.0 ** abs(MODES[mode].power), rel=1e-9)
    keeps = MODES[mode].keeps
    for dtype, f in cert["precisions"].items():
        for name in ("embedding", "head", "inverse"):
            figure = f[name]
            assert figure["error_u"] == pytest.approx(figure["error"] / U[dtype])
            aimed = name == "inverse" or name == keeps
            if aimed:
                assert figure["verdict"] in ("pass", "inconclusive")
                assert figure["error"] <= figure["bound"], (dtype, name, figure)
            else:
                assert figure["verdict"] == "measured" and "bound" not in figure
                assert figure["error"] > 0.1  # a mode that does not keep it moves it
        assert f["scale"] == conv.scale and f["cond_T"] == pytest.approx(cert["cond_T"], rel=1e-4)
    f64 = cert["precisions"]["float64"]
    assert f64["verdict"] == "pass"
    assert f64["inverse"]["error_u"] < 1e4  # W E = s I to rounding
    if keeps:
        assert f64[keeps]["error_u"] < 1e3


def test_the_inverse_is_taken_against_the_scaled_identity():
    """||W E - s I||_F / s with W = s T Z^T: checked where it is macroscopic (Z moved 1e-6 off the manifold),
    against the module's own maps; the scale is the mode's."""
    E0 = table()
    good = convert_table(E0, "keep-embedding-scaled", SCALE)
    rng = np.random.default_rng(3)
    off = Conversion(**dict(vars(good), Z=good.Z @ (np.eye(16) + 1e-6 * rng.standard_normal((16, 16)))))
    f = measure(E0, off, "float64")
    E, W = maps(off, "float64")
    expected = np.linalg.norm(W @ E - SCALE * np.eye(16)) / SCALE
    assert f["scale"] == SCALE and expected > 1e-6
    assert f["inverse"]["error"] == pytest.approx(expected, rel=1e-6)
    assert f["head"]["error"] == pytest.approx(rel(W, E0.T), rel=1e-9)


def _with_t(good: Conversion, T: np.ndarray, **changes) -> Conversion:
    fields = dict(vars(good), L=cholesky_factor(0.5 * (T + T.T)), **changes)
    return Conversion(**fields)


def test_a_wrong_t_fails_the_figure_its_mode_keeps():
    """T = H where keep-embedding needs H^-1, and H^-1 where keep-head needs H: each fails in float64."""
    E0 = table()
    _, Q, s, _ = oracle(E0)
    emb, head = convert_table(E0, "keep-embedding"), convert_table(E0, "keep-head")
    assert measure(E0, _with_t(emb, (Q * s) @ Q.T), "float64")["embedding"]["verdict"] == "fail"
    assert measure(E0, _with_t(head, (Q / s) @ Q.T), "float64")["head"]["verdict"] == "fail"
    assert measure(E0, emb, "float64")["embedding"]["verdict"] == "pass"
    assert measure(E0, head, "float64")["head"]["verdict"] == "pass"


def test_keep_heads_bound_sees_no_conditioning_and_the_embeddings_does():
    """W = T Z^T involves no solve: keep-head's float32 head is judged (pass) at cond 1e4, where the
    embedding's bound of keep-embedding (amplified by cond(T)) cannot resolve float32 (inconclusive)."""
    E0 = table(cond=1e4)
    head = measure(E0, convert_table(E0, "keep-head"), "float32")["head"]
    emb = measure(E0, convert_table(E0, "keep-embedding"), "float32")["embedding"]
    assert head["verdict"] == "pass" and head["bound"] < 1e-4
    assert emb["verdict"] == "inconclusive" and emb["bound"] > 0.1


def test_the_inverse_bound_covers_a_memory_off_the_manifold():
    """Z^T Z = I + D with D aligned with T's extreme eigenvectors: T D T^-1 is cond(T) times larger than D,
    and the bound (cond(T) ||Z^T Z - I||_F + the solves') still holds it, in float64 where it resolves."""
    E0 = table(cond=1e3)
    conv = convert_table(E0, "keep-embedding")
    _, Q, _, _ = oracle(E0)
    delta = 1e-7 * (np.outer(Q[:, 0], Q[:, -1]) + np.outer(Q[:, -1], Q[:, 0]))
    w, V = np.linalg.eigh(np.eye(16) + delta)
    Z = conv.Z @ (V * np.sqrt(w)) @ V.T  # Z^T Z = I + delta
    f = certify_start(E0, conv, Z, conv.L)["precisions"]["float64"]
    assert f["inverse"]["error"] > 100 * f["orthonormality"]  # amplified by cond(T)
    assert f["inverse"]["verdict"] == "pass", f["inverse"]


def test_modes_are_refused_by_name_and_scale():
    E0 = table()
    with pytest.raises(PitcheckError, match="unknown conversion mode"):
        convert_table(E0, "keep-both")
    with pytest.raises(PitcheckError, match="needs its logit scale"):
        convert_table(E0, "keep-embedding-scaled")
    with pytest.raises(PitcheckError, match="has no logit scale"):
        convert_table(E0, "keep-head", 2.0)
    with pytest.raises(PitcheckError, match="positive finite"):
        convert_table(E0, "keep-embedding-scaled", -1.0)



def test_a_scaled_mode_from_its_unscaled_conversion_is_that_conversion_bit_for_bit():
    """in_mode: keep-embedding-scaled from keep-embedding's conversion (no second SVD) is convert_table's."""
    from dataclasses import fields

    from pitcheck.sources.pretrained.conversion import in_mode

    E0 = table()
    direct, derived = convert_table(E0, "keep-embedding-scaled", SCALE), in_mode(convert_table(E0),
                                                                                  "keep-embedding-scaled", SCALE)
    for f in fields(Conversion):
        a, b = getattr(direct, f.name), getattr(derived, f.name)
        assert (np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b), f.name
    with pytest.raises(PitcheckError, match="takes T = H\\^1, not keep-embedding's H\\^-1"):
        in_mode(convert_table(E0), "keep-head")
    with pytest.raises(PitcheckError, match="needs its logit scale"):
        in_mode(convert_table(E0), "keep-embedding-scaled")

# ---- the logit scale: a deterministic 1-D minimisation ------------------------------------------------------

def _logits(n=400, v=50, true_scale=4.0, seed=1):
    """Logits z and targets drawn from softmax(true_scale z): the fitted scale is near true_scale."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, v))
    p = np.exp(true_scale * z)
    p /= p.sum(axis=1, keepdims=True)
    targets = np.array([rng.choice(v, p=row) for row in p])
    return z, targets


def test_the_fitted_scale_minimises_the_loss():
    import scipy.optimize

    z, targets = _logits()
    fit = fit_logit_scale(z, targets)
    s = fit["scale"]
    assert abs(fit["slope"]) < 1e-6 and fit["loss"] == pytest.approx(scaled_loss(z, targets, s))
    for nearby in (s * 0.99, s * 1.01, 1.0):
        assert scaled_loss(z, targets, nearby) > fit["loss"]
    ref = scipy.optimize.minimize_scalar(lambda x: scaled_loss(z, targets, x), bounds=(0.1, 50), method="bounded",
                                         options={"xatol": 1e-10})
    assert s == pytest.approx(ref.x, rel=1e-5)
    assert 3.0 < s < 5.5  # the scale the targets were drawn with
    assert fit_logit_scale(z, targets) == fit  # deterministic


def test_the_slope_is_the_derivative():
    z, targets = _logits(n=50)
    h = 1e-5
    numeric = (scaled_loss(z, targets, 2.0 + h) - scaled_loss(z, targets, 2.0 - h)) / (2 * h)
    assert loss_slope(z, targets, 2.0) == pytest.approx(numeric, rel=1e-6)


def test_a_scale_fit_without_a_minimiser_is_refused():
    z, targets = _logits(n=50)
    worst = np.argmin(z, axis=1)  # the targets are the least likely tokens: the loss rises with s
    with pytest.raises(PitcheckError, match="no information"):
        fit_logit_scale(z, worst)
    with pytest.raises(PitcheckError, match="non-finite"):
        fit_logit_scale(np.full((2, 3), np.nan), np.zeros(2, dtype=int))


# ---- the verb and its files -----------------------------------------------------------------------------

def _cli(*argv):
    from pitcheck.cli import convert as cli_convert

    parser = argparse.ArgumentParser()
    cli_convert.add_parser(parser.add_subparsers())
    return cli_convert, parser.parse_args(["convert", *argv])


def test_cli_modes_are_the_conversion_modes_and_the_default_is_keep_embedding():
    _, args = _cli("t.npy", "--out", "o")
    assert args.mode == "keep-embedding"
    parser = argparse.ArgumentParser()
    from pitcheck.cli import convert as cli_convert

    action = next(a for a in cli_convert.add_parser(parser.add_subparsers())._actions if a.dest == "mode")
    assert list(action.choices) == list(MODES)


@pytest.mark.parametrize("mode", ["keep-head", "keep-embedding-scaled"])
def test_convert_verb_writes_the_mode_and_its_scale(tmp_path, capsys, mode):
    pytest.importorskip("safetensors")
    from pitcheck.sources.pretrained.conversion import read_converted

    E0 = table()
    np.save(tmp_path / "e0.npy", E0)
    extra = ["--scale", str(SCALE)] if mode.endswith("scaled") else []
    cli, args = _cli(str(tmp_path / "e0.npy"), "--out", str(tmp_path / "out"), "--dtype", "float64", "--certify",
                     "float64", "--mode", mode, *extra)
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    assert f"mode {mode}" in printed and "pass" in printed
    Z, L, s = read_converted(tmp_path / "out" / "converted.safetensors", with_scale=True)
    assert s == (SCALE if extra else 1.0)
    W = s * (L @ L.T) @ Z.T
    target = E0.T if mode == "keep-head" else SCALE * np.linalg.pinv(E0)
    assert rel(W, target) < 1e-12
    cert = json.loads((tmp_path / "out" / "certificate.json").read_text())
    assert cert["mode"] == mode and cert["scale"] == s and cert["precisions"]["float64"]["verdict"] == "pass"


def test_a_scaled_mode_needs_a_scale_for_a_table_without_a_model(tmp_path):
    np.save(tmp_path / "e0.npy", table())
    cli, args = _cli(str(tmp_path / "e0.npy"), "--out", str(tmp_path / "out"), "--mode", "keep-embedding-scaled")
    with pytest.raises(PitcheckError, match="pass --scale"):
        cli.main(args)


# ---- a run's start (the teacher hook) --------------------------------------------------------------------

def test_start_certificate_says_whether_a_run_starts_from_the_conversion(tmp_path):
    from pitcheck.trajectory.teacher import start_certificate

    E0 = table()
    exact = convert_table(E0, "keep-embedding")
    good = start_certificate("m.gguf:token_embd.weight", E0, exact.Z, exact.L)
    assert good["mode"] == "keep-embedding" and good["verdict"] == "pass" and good["start_is_conversion"]
    assert good["precisions"]["float64"]["embedding"]["error_u"] < 1e3
    # the polar factor with T0 = I is not keep-embedding's start: its embedding is judged and fails
    polar = start_certificate("m.gguf:token_embd.weight", E0, exact.Z, np.eye(16))
    assert polar["precisions"]["float64"]["embedding"]["verdict"] == "fail" and not polar["start_is_conversion"]
    # for a .npy teacher the start is the polar factor, T0 = I: the balanced mode, judged so
    npy = start_certificate(str(tmp_path / "t.npy"), E0, exact.Z, np.eye(16))
    assert npy["mode"] == "balanced" and npy["verdict"] == "pass" and npy["start_is_conversion"]
    assert start_certificate("", E0, exact.Z, exact.L) is None
    json.dumps(good)  # a manifest entry: plain JSON


def test_teacher_start_takes_a_mode(tmp_path):
    from pitcheck.trajectory.teacher import teacher_start

    E0 = table()
    Z, L = teacher_start("m.gguf:token_embd.weight", E0, "keep-head")
    assert rel((L @ L.T) @ Z.T, E0.T) < 1e-13
    Z, L = teacher_start("m.gguf:token_embd.weight", E0)
    assert rel(Z @ np.linalg.inv(L @ L.T), E0) < 1e-13
