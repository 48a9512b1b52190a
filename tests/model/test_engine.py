"""pitcheck.model.engine and the parts it steps with (amp: loss scaling, optim: the optimizers, backend: the
array backends, the PIT head's step): each optimizer's step against a hand computation, fp16 loss
scaling (unscaled gradients, halving on overflow, doubling after 2000 clean steps), the softplus chain
rule of L's diagonal, the Riemannian step (direction re-projected onto the tangent space before the
retraction), the guards (skipped steps, their events, the part a breakdown names), the state round
trips, and the backend/policy set-up."""
import math

import numpy as np
import pytest
import torch

from pitcheck.model import amp, optim
from pitcheck.numerics.arrays import NumpyOps, TorchOps
from pitcheck.model.engine import Engine, StateBreakdown, StepSettings, resolve_device
from pitcheck.model.heads import get_head
from pitcheck.infra.errors import PitcheckError
from pitcheck.numerics.formats import FORMATS
from pitcheck.numerics.policy import Policy, get_policy
from pitcheck.numerics.reference import embedding_matrix, softplus_inverse

# Z: orthonormal 4 x 2 with exact entries; L: lower, positive diagonal
Z0 = np.array([[0.6, 0.0], [0.0, 0.8], [0.8, 0.0], [0.0, 0.6]])
L0 = np.array([[1.5, 0.0], [0.25, 0.75]])
GZ = np.array([[0.5, -1.0], [2.0, 0.25], [-0.75, 1.5], [1.0, -0.5]])
GL = np.array([[0.5, 0.0], [-2.0, 1.25]])


def _sym(a):
    return 0.5 * (a + a.T)


def _proj(Z, G):
    return G - Z @ _sym(Z.T @ G)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x):
    return np.log1p(np.exp(x))


def _engine(optimizer="sgd", lr=0.1, retraction="none", backend="numpy", precision="fp64", **kw):
    eng = Engine(backend, get_policy(precision), StepSettings(retraction, optimizer, lr, **kw), device="cpu")
    eng.initialise(Z0, L0)
    return eng


def _master(eng):
    return {k: eng.arrays.numpy(v) for k, v in eng.master.items()}


def _raw(L):
    return np.tril(L, -1) + np.diag(softplus_inverse(np.diag(L)))


def _raw_gradient(GL, raw):
    """The chain rule through L = tril(raw, -1) + diag(softplus(diag(raw))): softplus' = sigmoid."""
    return np.tril(GL, -1) + np.diag(np.diag(GL) * _sigmoid(np.diag(raw)))


# ---- the optimizers against hand computations ------------------------------------------------------
def test_one_sgd_step_by_hand_with_the_softplus_chain_factor_on_the_diagonal():
    eng = _engine("sgd", lr=0.1)
    raw = _raw(L0)
    assert eng.step({"Z": GZ, "L": GL}, 0) == []
    m = _master(eng)
    np.testing.assert_allclose(m["Z"], Z0 - 0.1 * _proj(Z0, GZ), rtol=0, atol=1e-16)
    np.testing.assert_allclose(m["raw"], raw - 0.1 * _raw_gradient(GL, raw), rtol=0, atol=4e-16)
    # the diagonal by hand: softplus^{-1}(1.5) = log(e^1.5 - 1), its sigmoid is 1 - e^-1.5
    r0 = math.log(math.expm1(1.5))
    assert m["raw"][0, 0] == pytest.approx(r0 - 0.1 * 0.5 * (1 - math.exp(-1.5)), rel=1e-15, abs=0)
    # the strict lower triangle moves by the gradient itself
    assert m["raw"][1, 0] == pytest.approx(0.25 + 0.2, rel=1e-15)
    Zs, Ls = eng.stored()
    np.testing.assert_allclose(Ls, np.tril(m["raw"], -1) + np.diag(_softplus(np.diag(m["raw"]))), rtol=1e-15)
    assert eng.opt_step == 1


def test_one_adam_step_by_hand():
    """t = 1: m = 0.1 g, v = 0.001 g^2; bias-corrected m_hat = g, v_hat = g^2: the step is lr g / (|g| + 1e-8)."""
    eng = _engine("adam", lr=0.01)
    raw = _raw(L0)
    eng.step({"Z": GZ, "L": GL}, 0)
    m = _master(eng)
    graw = _raw_gradient(GL, raw)
    # the off-diagonal entry, by hand: g = -2, the step is -0.01 * (-2) / (2 + 1e-8)
    assert m["raw"][1, 0] == pytest.approx(0.25 + 0.01 * 2 / (2 + 1e-8), rel=1e-15)
    np.testing.assert_allclose(m["raw"], raw - 0.01 * graw / (np.abs(graw) + 1e-8), rtol=0, atol=1e-15)
    pz = _proj(Z0, GZ)
    np.testing.assert_allclose(m["Z"], Z0 + _proj(Z0, -0.01 * pz / (np.abs(pz) + 1e-8)), rtol=0, atol=1e-15)
    np.testing.assert_allclose(eng.arrays.numpy(eng.opt["mL"]), 0.1 * graw, rtol=1e-15, atol=0)
    np.testing.assert_allclose(eng.arrays.numpy(eng.opt["vL"]), 0.001 * graw**2, rtol=1e-13, atol=0)


def test_two_adam_steps_by_hand_use_the_step_count_in_the_bias_correction():
    eng = _engine("adam", lr=0.01)
    G2 = np.array([[1.0, 0.0], [0.5, -0.25]])
    eng.step({"Z": np.zeros_like(Z0), "L": GL}, 0)
    raw1 = _master(eng)["raw"]
    eng.step({"Z": np.zeros_like(Z0), "L": G2}, 1)
    g1, g2 = _raw_gradient(GL, _raw(L0)), _raw_gradient(G2, raw1)
    m = 0.9 * (0.1 * g1) + 0.1 * g2
    v = 0.999 * (0.001 * g1**2) + 0.001 * g2**2
    step = (m / (1 - 0.9**2)) / (np.sqrt(v / (1 - 0.999**2)) + 1e-8)
    np.testing.assert_allclose(_master(eng)["raw"], raw1 - 0.01 * step, rtol=0, atol=1e-15)
    # zero gradients: the moments stay zero and nothing moves
    np.testing.assert_array_equal(_master(eng)["Z"], Z0)
    assert eng.opt_step == 2


def test_adam_bias_correction_late_in_a_run():
    """t = 700 from zero moments: 1 - 0.999^700 = 0.4964 (below 1/2, where 1 % b and 1 - b part ways)."""
    eng = _engine("adam", lr=0.01)
    eng.opt_step = 699
    eng.step({"Z": np.zeros_like(Z0), "L": GL}, 699)
    g = _raw_gradient(GL, _raw(L0))
    m_hat = 0.1 * g / (1 - 0.9**700)
    v_hat = 0.001 * g**2 / (1 - 0.999**700)
    np.testing.assert_allclose(_master(eng)["raw"], _raw(L0) - 0.01 * m_hat / (np.sqrt(v_hat) + 1e-8),
                               rtol=0, atol=1e-15)


def test_two_momentum_steps_by_hand():
    eng = _engine("momentum", lr=0.1)
    eng.step({"Z": np.zeros_like(Z0), "L": GL}, 0)
    raw1 = _master(eng)["raw"]
    g1 = _raw_gradient(GL, _raw(L0))
    np.testing.assert_allclose(raw1, _raw(L0) - 0.1 * g1, rtol=0, atol=4e-16)
    eng.step({"Z": np.zeros_like(Z0), "L": GL}, 1)
    g2 = _raw_gradient(GL, raw1)
    np.testing.assert_allclose(_master(eng)["raw"], raw1 - 0.1 * (0.9 * g1 + g2), rtol=0, atol=4e-16)
    np.testing.assert_allclose(eng.arrays.numpy(eng.opt["mL"]), 0.9 * g1 + g2, rtol=1e-15)


def test_sgd_keeps_no_optimizer_state():
    eng = _engine("sgd")
    eng.step({"Z": GZ, "L": GL}, 0)
    assert all(not np.any(eng.arrays.numpy(v)) for v in eng.opt.values())
    assert sorted(eng.opt) == ["mL", "mZ", "vL", "vZ"]


# ---- the Riemannian step -----------------------------------------------------------------------------
def test_the_step_is_reprojected_onto_the_tangent_space_before_the_retraction():
    """Adam's elementwise scaling leaves the tangent space: with the identity retraction ('none'),
    Z_new - Z must still be tangent at Z, sym(Z^T xi) = 0 (Z0 is orthonormal to rounding)."""
    eng = _engine("adam", lr=0.01)
    eng.step({"Z": GZ, "L": GL}, 0)
    xi = _master(eng)["Z"] - Z0
    assert np.abs(_sym(Z0.T @ xi)).max() < 1e-15  # unprojected: 1e-3
    assert np.abs(xi).max() > 1e-3  # it did move


def test_momentum_reprojects_its_remembered_direction_at_the_new_point():
    """Momentum's second direction 0.9 P_Z0(g1) + P_Z1(g2) is not tangent at Z1: the step is its projection."""
    eng = _engine("momentum", lr=0.1)
    G2 = GZ[::-1].copy()
    eng.step({"Z": GZ, "L": GL}, 0)
    Z1 = _master(eng)["Z"]
    eng.step({"Z": G2, "L": GL}, 1)
    d2 = 0.9 * _proj(Z0, GZ) + _proj(Z1, G2)
    np.testing.assert_allclose(_master(eng)["Z"], Z1 + _proj(Z1, -0.1 * d2), rtol=0, atol=1e-15)


def test_the_retraction_gets_the_projected_step():
    """polar retraction of Z + xi, xi = P_Z(-lr d): the result is the polar factor of that sum."""
    eng = _engine("adam", lr=0.05, retraction="polar")
    eng.step({"Z": GZ, "L": GL}, 0)
    pz = _proj(Z0, GZ)
    Y = Z0 + _proj(Z0, -0.05 * pz / (np.abs(pz) + 1e-8))
    U, _, Vt = np.linalg.svd(Y, full_matrices=False)
    np.testing.assert_allclose(_master(eng)["Z"], U @ Vt, rtol=0, atol=1e-15)


def test_reproject_every_k_steps_on_the_kth_step_only():
    """k = 3: re-projected after step indices 2 and 5 (the 3rd and 6th steps), and after no other."""
    eng = _engine("sgd", lr=0.2, reproject_every=3)
    for index in range(6):
        eng.step({"Z": GZ, "L": GL}, index)
        Z = _master(eng)["Z"]
        drift = np.linalg.norm(Z.T @ Z - np.eye(2))
        if index in (2, 5):
            assert drift < 1e-15, index
        else:  # 'none' drifts at second order
            assert drift > 1e-3, index


def test_reproject_threshold_reprojects_above_it_and_records_before_and_after():
    eng = _engine("sgd", lr=0.2, reproject_threshold=1e-3)
    Zn = Z0 - 0.2 * _proj(Z0, GZ)
    gram_err = np.linalg.norm(Zn.T @ Zn - np.eye(2))
    assert gram_err > 1e-3
    events = eng.step({"Z": GZ, "L": GL}, 0)
    assert [e["event"] for e in events] == ["reprojected"]
    assert events[0]["orthonormality"] == pytest.approx(gram_err, rel=1e-12)
    assert events[0]["after"] < 1e-15
    Z = _master(eng)["Z"]
    assert np.linalg.norm(Z.T @ Z - np.eye(2)) < 1e-15
    # a drift below the threshold is left alone, and no event
    eng = _engine("sgd", lr=0.2, reproject_threshold=gram_err * 1.01)
    assert eng.step({"Z": GZ, "L": GL}, 0) == []
    np.testing.assert_allclose(_master(eng)["Z"], Zn, atol=1e-16)


def test_reproject_threshold_is_exclusive():
    """A drift exactly at the threshold is left alone: the guard fires above it."""
    probe = _engine("sgd", lr=0.2)
    probe.step({"Z": GZ, "L": GL}, 0)
    Zn = _master(probe)["Z"]
    gram_err = float(np.linalg.norm(Zn.T @ Zn - np.eye(2)))
    eng = _engine("sgd", lr=0.2, reproject_threshold=gram_err)
    assert eng.step({"Z": GZ, "L": GL}, 0) == []
    np.testing.assert_array_equal(_master(eng)["Z"], Zn)
    eng = _engine("sgd", lr=0.2, reproject_threshold=np.nextafter(gram_err, 0))
    assert [e["event"] for e in eng.step({"Z": GZ, "L": GL}, 0)] == ["reprojected"]


# ---- fp16 loss scaling -------------------------------------------------------------------------------
def test_fp16_gradients_are_unscaled_before_the_step():
    """fp16: the gradient is multiplied by the loss scale 2^16 to fit fp16, and divided by it again
    before the optimizer sees it: raw moves by lr g exactly (powers of two throughout)."""
    eng = _engine("sgd", lr=0.0625, backend="torch", precision="fp16")
    assert eng.loss_scale == 2.0**16
    Z_before = _master(eng)["Z"]
    GLp = np.array([[0.0, 0.0], [0.25, 0.0]])
    assert eng.step({"Z": np.zeros_like(Z0), "L": GLp}, 0) == []
    raw = _master(eng)["raw"]
    assert raw[1, 0] == 0.25 - 0.0625 * 0.25
    np.testing.assert_array_equal(_master(eng)["Z"], Z_before)


def test_the_loss_scale_after_2001_clean_steps_is_doubled_once():
    """GradScaler's rule: after 2000 clean steps in a row the scale doubles and the count restarts.
    The count is the engine's, whatever the backend: 2001 real steps of a float64 engine with loss
    scaling on (a torch fp16 step costs 30 times more, and the rule is the same code)."""
    pol = Policy("fp64", "fp64", "fp64", "fp64", "fp64", "fp64", loss_scaling=True)
    eng = Engine("numpy", pol, StepSettings("none", "sgd", 0.0625))
    eng.initialise(Z0, L0)
    zero = {"Z": np.zeros_like(Z0), "L": np.zeros_like(L0)}
    history = []
    for k in range(2001):
        assert eng.step(zero, k) == []
        history.append((eng.loss_scale, eng.scaler.good_steps))
    assert history[1998] == (2.0**16, 1999)
    assert history[1999] == (2.0**17, 0)
    assert history[2000] == (2.0**17, 1)
    assert {s for s, _ in history[:1999]} == {2.0**16}


def test_the_fp16_loss_scale_grows_at_the_2000th_clean_step():
    eng = _engine("sgd", lr=0.0625, backend="torch", precision="fp16")
    zero = {"Z": np.zeros_like(Z0), "L": np.zeros_like(L0)}
    eng.scaler.good_steps = 1998
    eng.step(zero, 1998)
    assert (eng.loss_scale, eng.scaler.good_steps) == (2.0**16, 1999)
    eng.step(zero, 1999)
    assert (eng.loss_scale, eng.scaler.good_steps) == (2.0**17, 0)
    eng.step(zero, 2000)
    assert (eng.loss_scale, eng.scaler.good_steps) == (2.0**17, 1)


def test_loss_scale_constants_are_gradscalers():
    assert amp.LOSS_SCALE_INIT == 65536.0 and amp.LOSS_SCALE_GROWTH_INTERVAL == 2000


def test_gradient_overflow_halves_the_loss_scale_and_resets_the_count():
    eng = _engine("sgd", lr=0.0625, backend="torch", precision="fp16")
    eng.scaler.good_steps = 7
    before = _master(eng)
    # 1.0 * 2^16 = 65536 rounds to inf in fp16 (its largest is 65504, the overflow threshold 65520)
    events = eng.step({"Z": np.zeros_like(Z0), "L": np.array([[0.0, 0.0], [1.0, 0.0]])}, 0)
    assert events == [{"event": "gradient_overflow", "format": "fp16", "loss_scale": 65536.0,
                       "action": "step skipped, loss scale halved"}]
    assert (eng.loss_scale, eng.scaler.good_steps, eng.opt_step) == (32768.0, 0, 0)
    for k, v in _master(eng).items():
        np.testing.assert_array_equal(v, before[k])
    # at the halved scale it fits: 32768 < 65520
    assert eng.step({"Z": np.zeros_like(Z0), "L": np.array([[0.0, 0.0], [1.0, 0.0]])}, 1) == []
    assert (eng.loss_scale, eng.scaler.good_steps) == (32768.0, 1)


@pytest.mark.parametrize("fmt,value,fits", [
    # fp16's overflow threshold 65520 is exclusive: just below fits, at it does not, either sign
    ("fp16", 65519.0, True), ("fp16", -65519.0, True), ("fp16", 65520.0, False), ("fp16", -65520.0, False),
    # bf16's threshold is (2 - 2^-8) 2^127
    ("bf16", (2 - 2.0**-8) * 2.0**127 * (1 - 2.0**-20), True), ("bf16", 1e39, False),
    # e4m3 has no inf (overflow_threshold is None): 449 rounds to 448 and fits, 470 rounds past it
    ("fp8-e4m3", 449.0, True), ("fp8-e4m3", -470.0, False),
    ("fp64", 1e308, True), ("fp64", np.inf, False),
])
def test_fits_a_gradient_format(fmt, value, fits):
    assert amp.fits(np.array([[0.0, value]]), fmt) is fits


def test_overflow_threshold_is_exclusive():
    """fp16's overflow threshold 65520: a scaled peak just below fits, at it does not."""
    eng = _engine("sgd", backend="torch", precision="fp16")
    below = np.array([[65519.0 / 65536.0]])
    at = np.array([[65520.0 / 65536.0]])
    assert eng.gradient_in_format(below)[1] is True and eng.gradient_in_format(-below)[1] is True
    assert eng.gradient_in_format(at)[1] is False and eng.gradient_in_format(-at)[1] is False
    g, _ = eng.gradient_in_format(np.array([[0.5]]))
    assert g.dtype == torch.float16 and float(g) == 32768.0
    assert eng.gradient_in_format(np.zeros((0, 2)))[1] is True


def test_overflow_without_loss_scaling_only_skips():
    eng = _engine("sgd", backend="torch", precision="bf16")
    assert eng.loss_scale == 1.0
    events = eng.step({"Z": np.zeros_like(Z0), "L": np.array([[0.0, 0.0], [1e39, 0.0]])}, 0)
    assert events == [{"event": "gradient_overflow", "format": "bf16", "loss_scale": 1.0, "action": "step skipped"}]
    assert eng.loss_scale == 1.0
    # bf16's threshold is (2 - 2^-8) 2^127: just below fits
    fits = eng.gradient_in_format(np.array([[(2 - 2.0**-8) * 2.0**127 * (1 - 2.0**-20)]]))[1]
    assert fits is True


def test_a_gradient_format_without_infinities_is_judged_by_rounding():
    """e4m3 has no inf (overflow_threshold is None): 449 rounds to 448 and fits, 470 rounds past it."""
    pol = Policy("fp64", "fp64", "fp64", "fp64", "fp64", "fp8-e4m3")
    eng = Engine("numpy", pol, StepSettings("none", "sgd", 0.1))
    assert eng.gradient_in_format(np.array([[449.0]]))[1] is True
    assert eng.gradient_in_format(np.array([[-470.0]]))[1] is False


def test_no_loss_scaling_in_fp64_and_clean_steps_are_not_counted():
    eng = _engine("sgd")
    assert eng.loss_scale == 1.0
    eng.step({"Z": GZ, "L": GL}, 0)
    assert (eng.loss_scale, eng.scaler.good_steps) == (1.0, 0)
    # a large gradient is not scaled, and is no overflow in fp64
    g, fits = eng.gradient_in_format(np.array([[3.0]]))
    assert fits and float(g[0, 0]) == 3.0


# ---- skipped steps ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["Z", "L"])
def test_a_nonfinite_gradient_skips_the_step(bad, where):
    eng = _engine("adam")
    grads = {"Z": GZ.copy(), "L": GL.copy()}
    grads[where][1, 0] = bad
    assert eng.step(grads, 0) == [{"event": "nonfinite_gradient", "action": "step skipped"}]
    assert eng.opt_step == 0
    np.testing.assert_array_equal(_master(eng)["Z"], Z0)


def test_a_step_that_overflows_is_skipped_before_the_retraction():
    eng = _engine("sgd", lr=1e10, retraction="polar")
    events = eng.step({"Z": 1e300 * GZ, "L": np.zeros_like(L0)}, 0)
    assert events == [{"event": "nonfinite_state", "action": "step skipped"}]
    np.testing.assert_array_equal(_master(eng)["Z"], Z0)


def test_a_nonfinite_master_is_not_committed():
    eng = _engine("sgd", lr=1e300)
    events = eng.step({"Z": np.zeros_like(Z0), "L": np.array([[0.0, 0.0], [1e300, 0.0]])}, 0)
    assert events == [{"event": "nonfinite_state", "action": "step skipped"}]
    np.testing.assert_array_equal(_master(eng)["raw"], _raw(L0))


@pytest.mark.parametrize("backend, error", [("numpy", np.linalg.LinAlgError("Eigenvalues did not converge")),
                                             ("torch", torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to "
                                                                                "converge (error code: 7)"))])
def test_a_factorisation_the_library_gives_up_on_is_a_failed_retraction_not_a_crash(backend, error, monkeypatch):
    """The default compare grid at 10^4 steps met torch's eigh failing to converge inside polar-gram (an
    ill-conditioned Gram) and crashed with a traceback: the library's own linalg error is a retraction that
    failed, recorded and skipped like one that pitcheck detects itself."""
    eng = _engine("sgd", lr=0.1, retraction="polar-gram", backend=backend,
                  precision="fp64" if backend == "numpy" else "fp32")
    before = _master(eng)["Z"]

    def gives_up(x):
        raise error

    monkeypatch.setattr(eng.model.ops if hasattr(eng.model, "ops") else eng.ops, "eigh", gives_up)
    events = eng.step({"Z": GZ, "L": np.zeros_like(L0)}, 0)
    assert [e["event"] for e in events] == ["retraction_failed"] and events[0]["action"] == "step skipped"
    assert events[0]["message"].startswith("polar-gram: LinAlgError") and "converge" in events[0]["message"]
    np.testing.assert_array_equal(_master(eng)["Z"], before)


def test_an_error_that_is_not_the_librarys_linalg_failure_still_raises(monkeypatch):
    eng = _engine("sgd", lr=0.1, retraction="polar-gram")

    def broken(x):
        raise TypeError("a bug, not a failed factorisation")

    monkeypatch.setattr(eng.model.ops if hasattr(eng.model, "ops") else eng.ops, "eigh", broken)
    with pytest.raises(TypeError):
        eng.step({"Z": GZ, "L": np.zeros_like(L0)}, 0)


def test_a_failed_retraction_is_an_event_and_the_state_stays():
    eng = _engine("sgd", lr=1.0, retraction="polar-ns")
    events = eng.step({"Z": 50 * GZ, "L": np.zeros_like(L0)}, 0)
    assert len(events) == 1 and events[0]["event"] == "retraction_failed"
    assert events[0]["action"] == "step skipped" and "polar-ns" in events[0]["message"]
    np.testing.assert_array_equal(_master(eng)["Z"], Z0)


def test_a_diagonal_driven_to_zero_is_a_state_breakdown():
    eng = _engine("sgd", lr=1.0)
    with pytest.raises(StateBreakdown, match="diagonal") as caught:
        eng.step({"Z": np.zeros_like(Z0), "L": np.array([[5000.0, 0.0], [0.0, 0.0]])}, 0)
    assert caught.value.part == "T"


def _with(a, where, value):
    a = a.copy()
    a[where] = value
    return a


@pytest.mark.parametrize("Z,L,part,words", [
    (_with(Z0, (0, 0), np.nan), L0, "Z", ["Z has non-finite"]),
    (Z0, _with(L0, (1, 0), np.inf), "L", ["L has non-finite"]),
    (Z0, np.array([[1.5, 0.0], [0.25, -0.5]]), "T", ["diagonal", "-0.5", "T = L L^T"]),
    (Z0, np.array([[1.5, 0.0], [0.25, 0.0]]), "T", ["diagonal"]),
])
def test_degenerate_names_what_cannot_compute_and_the_breakdown_which_part(Z, L, part, words):
    eng = _engine()
    assert eng.degenerate() is None and eng.model.breakdown() is None
    eng.model.Z, eng.model.L = Z, L
    problem = eng.model.breakdown()
    assert isinstance(problem, StateBreakdown) and problem.part == part
    assert eng.degenerate() == str(problem)
    assert all(w in str(problem) for w in words)


@pytest.mark.parametrize("head,table,part", [("tied", "E", "E"), ("untied", "B", "B"), ("untied", "E", "E")])
def test_a_table_breakdown_names_its_table(head, table, part):
    eng = Engine("numpy", get_policy("fp64"), StepSettings("none", "sgd", 0.1), head=get_head(head))
    eng.initialise(Z0, L0)
    assert eng.degenerate() is None
    eng.model.stored_tables[table] = _with(Z0, (2, 1), np.nan)
    problem = eng.model.breakdown()
    assert problem.part == part and f"table {table} has non-finite" in str(problem)


# ---- state ------------------------------------------------------------------------------------------
def test_initialise_stores_L_through_its_raw_parameter():
    eng = _engine()
    Zs, Ls = eng.stored()
    np.testing.assert_array_equal(Zs, Z0)
    np.testing.assert_allclose(Ls, L0, rtol=1e-15, atol=0)
    np.testing.assert_allclose(_master(eng)["raw"], _raw(L0), rtol=1e-15)
    assert sorted(eng.opt) == ["mL", "mZ", "vL", "vZ"]
    assert eng.opt["mZ"].shape == Z0.shape and eng.opt["vL"].shape == L0.shape


def test_torch_engine_stores_in_its_formats():
    eng = _engine(backend="torch", precision="bf16-mixed")
    assert eng.master["Z"].dtype == torch.float32 and eng.model.Z.dtype == torch.bfloat16
    assert eng.model.L.dtype == torch.bfloat16 and eng.opt["mZ"].dtype == torch.float32
    Zs, Ls = eng.stored()
    assert Zs.dtype == np.float64
    assert Zs[0, 0] == float(torch.tensor(0.6, dtype=torch.bfloat16))


def test_snapshot_and_restore_bring_back_every_part_of_the_state():
    eng = _engine("adam", backend="torch", precision="fp16")
    snap = eng.snapshot()
    Z_before = eng.stored()[0]
    eng.step({"Z": GZ / 16, "L": GL / 16}, 0)  # 2 / 16 * 2^16 fits fp16
    assert eng.opt_step == 1 and eng.scaler.good_steps == 1
    eng.restore(snap)
    assert (eng.opt_step, eng.scaler.good_steps, eng.loss_scale) == (0, 0, 65536.0)
    np.testing.assert_array_equal(eng.stored()[0], Z_before)
    assert not any(bool(v.abs().max() > 0) for v in eng.opt.values())


def test_state_dict_round_trip_continues_identically():
    a = _engine("adam", backend="torch", precision="fp16")
    a.step({"Z": GZ / 16, "L": GL / 16}, 0)
    d = a.state_dict()
    assert d["loss_scale"] == 65536.0 and d["good_steps"] == 1 and d["opt_step"] == 1
    assert {"master_Z", "master_raw", "opt_mZ", "opt_vZ", "opt_mL", "opt_vL"} <= set(d)
    b = Engine("torch", get_policy("fp16"), StepSettings("none", "adam", 0.1), device="cpu")
    b.initialise(np.eye(4, 2), np.eye(2))
    b.load_state_dict(d)
    assert (b.loss_scale, b.scaler.good_steps, b.opt_step) == (65536.0, 1, 1)
    assert sorted(b.opt) == sorted(a.opt)
    assert b.opt["mZ"].dtype == torch.float32 and b.master["Z"].dtype == torch.float16
    for eng in (a, b):
        eng.step({"Z": GZ / 32, "L": GL / 32}, 1)
    for k, v in a.state_dict().items():
        np.testing.assert_array_equal(v, b.state_dict()[k])


def test_embed_all_is_Z_times_T_inverse_in_each_backend():
    eng = _engine()
    np.testing.assert_array_equal(eng.embed_all(), embedding_matrix(Z0, L0))
    t = _engine(backend="torch", precision="fp32")
    Et = t.embed_all()
    assert Et.dtype == np.float64
    np.testing.assert_allclose(Et, Z0 @ np.linalg.inv(L0 @ L0.T), rtol=2e-6, atol=0)
    # rounded to the storage format
    b = _engine(backend="torch", precision="bf16-mixed")
    Eb = b.embed_all()
    np.testing.assert_array_equal(Eb, torch.from_numpy(Eb).to(torch.bfloat16).double().numpy())


def test_distance_is_relative_in_Z_and_in_T():
    a, b = _engine(), _engine()
    assert a.distance(b) == (0.0, 0.0)
    b.model.Z = 2 * Z0
    b.model.L = L0 * math.sqrt(3)  # T scaled by 3
    dz, dt = b.distance(a)
    assert dz == pytest.approx(1.0, rel=1e-15) and dt == pytest.approx(2.0, rel=1e-15)
    dz, dt = a.distance(b)
    assert dz == pytest.approx(0.5, rel=1e-15) and dt == pytest.approx(2 / 3, rel=1e-15)


def test_interface_of_a_healthy_model_and_of_one_whose_embedding_overflowed():
    eng = _engine()
    row = eng.interface()
    assert row["orthonormality"] < 1e-15 and row["cond_T"] == pytest.approx(np.linalg.cond(L0 @ L0.T), rel=1e-12)
    assert "unmeasured" not in row or not row["unmeasured"]
    # fp16 storage, L's diagonal 2^-9: T^{-1} = 2^18 I, E = Z T^{-1} overflows fp16
    bad = Engine("torch", get_policy("fp16"), StepSettings("none", "sgd", 0.1), device="cpu")
    bad.initialise(Z0, np.diag([2.0**-9, 2.0**-9]))
    row = bad.interface()
    assert row["unmeasured"]
    assert np.isnan(row["pinv_drift"]) and np.isnan(row["trisolve_forward"])
    assert row["orthonormality"] == pytest.approx(np.linalg.norm(bad.stored()[0].T @ bad.stored()[0] - np.eye(2)))
    assert row["cond_T"] == pytest.approx(1.0) and np.isfinite(row["orthonormality_ratio"])
    assert np.isfinite(row["breakdown_margin"])


# ---- gradients from the models and an attached source -------------------------------------------------
def test_model_gradients_are_those_of_the_named_models_at_the_stored_model():
    from pitcheck.model.gradients import AdversaryParams, gradient

    eng = _engine()
    params = AdversaryParams()
    g = eng.gradients(["gaussian"], 3, 5, params)
    gz, gl = gradient(["gaussian"], Z0, L0, 3, 5, params)
    np.testing.assert_array_equal(g["Z"], gz)
    np.testing.assert_array_equal(g["L"], np.tril(gl))


# the source's name sorts after every model's name, or before them all: the rest is found by name, not by order
@pytest.mark.parametrize("source_name", ["zsource", "Asource"])
def test_an_attached_source_adds_its_gradient_to_the_rest(source_name):
    from pitcheck.model.gradients import AdversaryParams, gradient

    class Source:
        name = source_name

        def add_gradients(self, eng, grads, step):
            return {"grads": grads, "step": step}

        def snapshot(self):
            return "snap"

        def restore(self, snap):
            self.restored = snap

        def state_dict(self):
            return {"k": np.float64(1.5)}

        def load_state_dict(self, d):
            self.loaded = d

    eng = _engine()
    eng.source = Source()
    params = AdversaryParams()
    out = eng.gradients([_fresh(source_name), "gaussian"], 3, 5, params)  # matched by value
    assert out["step"] == 5
    np.testing.assert_array_equal(out["grads"]["Z"], gradient(["gaussian"], Z0, L0, 3, 5, params)[0])
    # not named: the source is not asked
    assert set(eng.gradients(["gaussian"], 3, 5, params)) == {"Z", "L"}
    snap = eng.snapshot()
    assert snap[-1] == "snap"
    eng.restore(snap)
    assert eng.source.restored == "snap"
    d = eng.state_dict()
    assert d["source_k"] == 1.5
    eng.load_state_dict(d)
    assert eng.source.loaded == {"k": 1.5}


# ---- settings, devices, backends -------------------------------------------------------------------
@pytest.mark.parametrize("kw,word", [
    (dict(optimizer="lion"), "unknown optimizer"),
    (dict(lr=0.0), "--lr"), (dict(lr=-1.0), "--lr"), (dict(lr=float("nan")), "--lr"), (dict(lr=float("inf")), "--lr"),
    (dict(reproject_every=-1), "--reproject-every"),
    (dict(reproject_threshold=-1e-9), "--reproject-threshold"),
    (dict(reproject_threshold=float("nan")), "--reproject-threshold"),
    (dict(reproject_threshold=float("inf")), "--reproject-threshold"),
    (dict(retraction="householder"), "unknown retraction"),
])
def test_step_settings_refuse_bad_values(kw, word):
    args = dict(retraction="qr", optimizer="sgd", lr=0.1)
    args.update(kw)
    with pytest.raises(PitcheckError, match=word):
        StepSettings(**args)


def test_step_settings_are_frozen():
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        StepSettings("qr", "sgd", 0.1).lr = 0.2


def test_step_settings_accept_the_edges():
    plain = StepSettings("qr", "sgd", 0.1)
    assert (plain.reproject_every, plain.reproject_threshold) == (0, 0.0)  # no guard unless asked
    s = StepSettings("qr", "adam", 1e-300, reproject_every=0, reproject_threshold=0.0)
    assert (s.reproject_every, s.reproject_threshold) == (0, 0.0)
    assert StepSettings("qr", "momentum", 5.0, 1, 1e-9).reproject_every == 1
    assert optim.OPTIMIZERS == ("sgd", "momentum", "adam")
    assert (optim.MOMENTUM, optim.BETA1, optim.BETA2, optim.ADAM_EPS) == (0.9, 0.9, 0.999, 1e-8)


def test_resolve_device_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    for bad, word in (("cuda", "no CUDA"), ("cuda:1", "no CUDA"), ("banana", "unknown device")):
        with pytest.raises(PitcheckError, match=word):
            resolve_device(bad)


def test_resolve_device_with_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda:1") == "cuda:1"
    assert resolve_device("cpu") == "cpu"
    for bad in ("tpu", "aardvark", ""):  # before and after 'auto' in sort order
        with pytest.raises(PitcheckError, match="unknown device"):
            resolve_device(bad)


@pytest.mark.parametrize("precision,matmul_format,matmul_dtype,emulated", [
    ("fp64", None, None, []), ("fp32", None, None, []), ("fp16-mixed", None, None, []),
    ("tf32", "tf32", None, ["tf32 matmul emulated on CPU by rounding operands to 11 bits"]),
    ("bf16", None, torch.bfloat16, ["bf16 matmul emulated on CPU: operands cast to bf16, fp32 accumulation, result rounded"]),
    ("fp16", None, torch.float16, ["fp16 matmul emulated on CPU: operands cast to fp16, fp32 accumulation, result rounded"]),
])
def test_torch_engine_on_cpu_emulates_the_policys_matmul(precision, matmul_format, matmul_dtype, emulated):
    eng = Engine("torch", get_policy(precision), StepSettings("qr", "sgd", 0.1), device="cpu")
    assert isinstance(eng.ops, TorchOps) and eng.device == "cpu"
    assert (eng.ops.matmul_format.name if eng.ops.matmul_format else None) == matmul_format
    assert eng.ops.matmul_dtype == matmul_dtype
    assert eng.ops.native is (matmul_dtype is None)
    assert eng.emulated == emulated
    assert eng.loss_scale == (65536.0 if get_policy(precision).loss_scaling else 1.0)
    assert (eng.scaler.good_steps, eng.opt_step, eng.source) == (0, 0, None)
    assert eng.arrays.dtypes[get_policy(precision).storage] == {"fp64": torch.float64, "fp32": torch.float32,
                                                         "bf16": torch.bfloat16, "fp16": torch.float16}[
        get_policy(precision).storage]


def test_torch_dtypes_per_format():
    eng = Engine("torch", get_policy("fp32"), StepSettings("qr", "sgd", 0.1), device="cpu")
    assert eng.arrays.dtypes == {"fp64": torch.float64, "fp32": torch.float32, "tf32": torch.float32,
                          "bf16": torch.bfloat16, "fp16": torch.float16}


def test_torch_engine_on_cuda_is_native_and_sets_tf32_explicitly(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        eng = Engine("torch", get_policy("tf32"), StepSettings("qr", "sgd", 0.1), device="cuda")
        assert eng.device == "cuda" and eng.ops.matmul_format is None and eng.emulated == []
        assert torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.allow_tf32 is True
        eng = Engine("torch", get_policy("fp32"), StepSettings("qr", "sgd", 0.1), device="cuda")
        assert torch.backends.cuda.matmul.allow_tf32 is False and torch.backends.cudnn.allow_tf32 is False
        eng = Engine("torch", get_policy("bf16"), StepSettings("qr", "sgd", 0.1), device="cuda")
        assert eng.ops.native is True and eng.ops.matmul_dtype == torch.bfloat16 and eng.emulated == []
        # a policy whose names are not interned literals (compared by value, not identity)
        fresh = Policy(*("".join(list(x)) for x in ("tf32", "fp32", "fp32", "fp32", "tf32", "fp32")))
        Engine("torch", get_policy("fp32"), StepSettings("qr", "sgd", 0.1), device="cuda")
        Engine("torch", fresh, StepSettings("qr", "sgd", 0.1), device="".join(list("cuda")))
        assert torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_numpy_backend_is_fp64_only_and_backends_are_named():
    for name in ("fp32", "tf32", "bf16-mixed"):  # names before and after 'fp64' in sort order
        with pytest.raises(PitcheckError, match="numpy backend is the float64 reference"):
            Engine("numpy", get_policy(name), StepSettings("qr", "sgd", 0.1))
    for bad in ("jax", "xla"):  # before and after 'torch' in sort order
        with pytest.raises(PitcheckError, match="unknown backend"):
            Engine(bad, get_policy("fp64"), StepSettings("qr", "sgd", 0.1))
    eng = Engine("numpy", get_policy("fp64"), StepSettings("qr", "sgd", 0.1))
    assert isinstance(eng.ops, NumpyOps) and eng.device == "cpu" and eng.emulated == []
    assert eng.model.retract is not None and eng.arrays.to([1, 2], "fp32").dtype == np.float64


def test_the_interface_units_use_the_factor_precision():
    """fp16 storage, fp32 factor: the breakdown margin is judged in the factor's u."""
    eng = _engine(backend="torch", precision="fp16")
    row = eng.interface()
    assert row["orthonormality_ratio"] == pytest.approx(
        np.abs(eng.stored()[0].T @ eng.stored()[0] - np.eye(2)).sum(axis=0).max() / (4 * 2.0**-11), rel=1e-6)
    assert FORMATS["fp32"].u == 2.0**-24


def _fresh(s: str) -> str:
    """An equal string that is not the interned literal: names read from a CLI or a file are such strings,
    and must be compared by value (== ), never by identity."""
    out = "".join(list(s))
    assert out == s and (out is not s or len(s) < 2)
    return out


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_names_from_outside_are_compared_by_value(optimizer):
    for backend, precision in (("numpy", "fp64"), ("torch", "tf32"), ("torch", "bf16"), ("torch", "fp16")):
        base = get_policy(precision)
        pol = Policy(*(_fresh(getattr(base, f)) for f in ("name", "storage", "master", "factor", "matmul", "gradient")),
                     loss_scaling=base.loss_scaling)
        settings = StepSettings(_fresh("none"), _fresh(optimizer), 0.0625)
        eng = Engine(_fresh(backend), pol, settings, device=_fresh("cpu"))
        ref = Engine(backend, base, StepSettings("none", optimizer, 0.0625), device="cpu")
        assert type(eng.ops) is type(ref.ops) and eng.emulated == ref.emulated
        assert eng.ops.__dict__.keys() == ref.ops.__dict__.keys()
        assert [getattr(eng.ops, k, None) for k in ("matmul_format", "matmul_dtype", "native")] == \
            [getattr(ref.ops, k, None) for k in ("matmul_format", "matmul_dtype", "native")]
        for e in (eng, ref):
            e.initialise(Z0, L0)
            e.step({"Z": GZ / 16, "L": GL / 16}, 0)
        for k, v in ref.state_dict().items():
            np.testing.assert_array_equal(eng.state_dict()[k], v)
        np.testing.assert_array_equal(eng.embed_all(), ref.embed_all())
        # a state read back with keys that are not literals
        eng.load_state_dict({_fresh(k): v for k, v in ref.state_dict().items()})
        assert eng.opt_step == 1 and sorted(eng.opt) == sorted(ref.opt)
    assert resolve_device(_fresh("auto")) in ("cpu", "cuda")


def test_interface_fallback_measures_the_trisolve_on_its_256_sampled_rows():
    """Two rows of E overflow fp16, rows outside the 256 evenly spaced rows that are sampled (one inside
    the 255, one inside the 257 that are not): the head metrics are undefined, the trisolve metrics are
    those of the sample."""
    from pitcheck.numerics.metrics import sample_ids, trisolve_errors

    V = 300
    s255, s256, s257 = (set(sample_ids(V, n).tolist()) for n in (255, 256, 257))
    bad = [min(s255 - s256), min(s257 - s256)]  # sampled by a count off by one either way
    rng = np.random.default_rng(0)
    Z = rng.uniform(0.01, 0.05, (V, 2))
    Z[bad] = 1000.0  # T^{-1} ~ 2^8: 2.5e5 > 65504
    L = np.array([[2.0**-4, 0.0], [2.0**-6, 2.0**-4]])
    eng = Engine("torch", get_policy("fp16"), StepSettings("none", "sgd", 0.1), device="cpu")
    eng.initialise(Z, L)
    row = eng.interface()
    Zs, Ls = eng.stored()
    E = eng.embed_all()
    assert not np.isfinite(E[bad]).any() and np.isfinite(np.delete(E, bad, axis=0)).all()
    assert np.isnan(row["pinv_drift"]) and row["unmeasured"]
    ids = sample_ids(V, 256)
    want = trisolve_errors(Zs, Ls, E[ids], ids, eng.policy.u, row["cond_T"])
    for k in ("trisolve_forward", "trisolve_forward_ratio", "trisolve_backward", "trisolve_backward_ratio"):
        assert row[k] == want[k], k


def test_the_numpy_engine_embeds_through_the_checked_reference():
    """The float64 engine's embedding is reference.embedding_matrix, which refuses a non-finite L with a
    PitcheckError (the generic solves would return NaN silently)."""
    eng = Engine(_fresh("numpy"), get_policy("fp64"), StepSettings("none", "sgd", 0.1))
    eng.initialise(Z0, L0)
    eng.model.L = np.array([[1.5, 0.0], [np.inf, 0.75]])
    with pytest.raises(PitcheckError, match="finite"):
        eng.embed_all()


# ---- the optimizers on their own: plain arrays in, a direction and the moments to keep out ------------
_G, _M, _V = np.array([2.0, -0.5]), np.array([0.5, 0.5]), np.array([0.25, 1.0])


@pytest.mark.parametrize("name,direction,m,v", [
    ("sgd", _G, _M, _V),
    ("momentum", 0.9 * _M + _G, 0.9 * _M + _G, _V),
    ("adam", (0.9 * _M + 0.1 * _G) / (1 - 0.9**3) / (np.sqrt((0.999 * _V + 0.001 * _G**2) / (1 - 0.999**3)) + 1e-8),
     0.9 * _M + 0.1 * _G, 0.999 * _V + 0.001 * _G**2),
])
def test_each_optimizer_turns_a_gradient_into_a_direction_at_step_3(name, direction, m, v):
    d, (m_new, v_new) = optim.get_optimizer(name)(_G, (_M, _V), 3, NumpyOps())
    np.testing.assert_allclose(d, direction, rtol=1e-15, atol=0)
    np.testing.assert_allclose(m_new, m, rtol=1e-15, atol=0)
    np.testing.assert_allclose(v_new, v, rtol=1e-15, atol=0)
    assert _M.tolist() == [0.5, 0.5] and _V.tolist() == [0.25, 1.0]  # the moments given are not written into


def test_the_optimizer_registry():
    assert optim.OPTIMIZERS == tuple(optim.OPTIMIZER_FUNCTIONS) == ("sgd", "momentum", "adam")
    assert optim.MOMENTS == ("m", "v")
    for bad in ("lion", "Adam", ""):
        with pytest.raises(PitcheckError, match="unknown optimizer"):
            optim.get_optimizer(bad)


def test_the_loss_scaler_alone():
    off = amp.LossScaler(False)
    assert (off.scale, off.scaled(np.array([3.0]))[0], off.overflowed(), off.scale) == (1.0, 3.0, "step skipped", 1.0)
    off.clean_step()
    assert off.good_steps == 0
    on = amp.LossScaler(True)
    assert on.scaled(np.array([3.0]))[0] == 3.0 * 2.0**16 and on.unscale(2.0**17) == 2.0
    on.good_steps = 5
    assert on.overflowed() == "step skipped, loss scale halved" and (on.scale, on.good_steps) == (2.0**15, 0)
