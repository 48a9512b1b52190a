"""The metrics API at its edge: what it refuses (with a PitcheckError saying why) and what it accepts."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pitcheck import PitcheckError
from pitcheck.numerics import metrics, reference
from tests.helpers import pit_pair

U = 2.0**-53


def test_an_upper_triangular_l_is_refused():
    # the reported case: an exact pair with L given as its transpose gave a forward error of 4.8
    Z, L = pit_pair(100, 6, 100.0)
    E = reference.embedding_matrix(Z, L)
    with pytest.raises(PitcheckError, match="lower triangular"):
        metrics.interface_metrics(Z, L.T.copy(), E, U)
    with pytest.raises(PitcheckError, match="lower triangular"):
        metrics.trisolve_errors(Z, L.T.copy(), E[:5], np.arange(5), U)


@pytest.mark.parametrize("diag", [0.0, -1.0])
def test_a_singular_or_negative_diagonal_is_refused(diag):
    L = np.eye(4)
    L[2, 2] = diag
    with pytest.raises(PitcheckError, match="positive diagonal"):
        metrics.cholesky_conditioning(L, U)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_refused_before_any_factorisation(monkeypatch, bad):
    Z, L = pit_pair(50, 4, 10.0)
    E = reference.embedding_matrix(Z, L)
    monkeypatch.setattr(np.linalg, "svd", lambda *a, **k: pytest.fail("SVD reached with non-finite input"))
    for name, args in [("Z", (Z, L, E)), ("L", (Z, L, E)), ("E", (Z, L, E))]:
        args = [a.copy() for a in args]
        args["ZLE".index(name)][1, 0] = bad
        with pytest.raises(PitcheckError, match="non-finite"):
            metrics.interface_metrics(*args, U)
    E_bad = E.copy()
    E_bad[3, 1] = bad
    for f in (metrics.pinv_error, metrics.pinv_drift, metrics.penrose_residuals, metrics.head_metrics):
        with pytest.raises(PitcheckError, match="non-finite"):
            f(E_bad, Z)


@pytest.mark.parametrize("u", [0.0, -1e-3, 1.0, 2.0, np.nan, np.inf, "x", None])
def test_unit_roundoff_must_lie_in_0_1(u):
    Z, L = pit_pair(30, 3, 1.0)
    with pytest.raises(PitcheckError, match="u"):
        metrics.orthonormality_ratio(Z, u)
    with pytest.raises(PitcheckError):
        metrics.interface_metrics(Z, L, reference.embedding_matrix(Z, L), u)


@pytest.mark.parametrize("rows", [0, -1, 2.5, True, "3"])
def test_sample_rows_must_be_a_positive_integer(rows):
    Z, L = pit_pair(30, 3, 1.0)
    with pytest.raises(PitcheckError, match="sample_rows"):
        metrics.interface_metrics(Z, L, reference.embedding_matrix(Z, L), U, sample_rows=rows)


@pytest.mark.parametrize("bad,match", [
    (np.ones((5, 3), dtype=complex), "real"),
    (np.ones((5, 3), dtype=bool), "real numeric"),
    (np.array([["a"] * 3] * 5), "real numeric"),
    (np.ones(5), "2-D"),
    (np.ones((0, 3)), "non-empty"),
    (object(), "real numeric"),
])
def test_arrays_that_are_not_real_matrices_are_refused(bad, match):
    with pytest.raises(PitcheckError, match=match):
        metrics.orthonormality_loss(bad)


def test_ids_must_be_rows():
    Z, L = pit_pair(30, 3, 1.0)
    E = reference.embedding_matrix(Z, L)
    for ids, match in [(np.array([0, 30]), "out of range"), (np.array([0.0, 1.0]), "row indices"),
                       (np.array([], dtype=int), "non-empty")]:
        with pytest.raises(PitcheckError, match=match):
            metrics.trisolve_errors(Z, L, E[:2], ids, U)
    with pytest.raises(PitcheckError, match="shape mismatch"):
        metrics.trisolve_errors(Z, L, E[:3], np.arange(2), U)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_torch_tensors_of_any_float_dtype_are_measured_as_stored(dtype):
    Z, L = pit_pair(200, 8, 10.0)
    Zt, Lt = torch.from_numpy(Z).to(dtype), torch.from_numpy(L).to(dtype)
    Et = torch.linalg.solve_triangular(Lt.float().T, torch.linalg.solve_triangular(Lt.float(), Zt.float().T,
                                       upper=False), upper=True).T.to(dtype)
    u = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11 if dtype == torch.float16 else 2.0**-24
    got = metrics.interface_metrics(Zt, Lt, Et, u)
    # the same values as float64 numpy copies of what the tensors hold
    want = metrics.interface_metrics(Zt.double().numpy(), Lt.double().numpy(), Et.double().numpy(), u)
    assert got == want
    assert all(np.isfinite(v) for v in got.values() if not isinstance(v, bool))
    assert metrics.pinv_drift(Et.requires_grad_(False), Zt) == metrics.pinv_drift(Et.double().numpy(),
                                                                                   Zt.double().numpy())


def test_complex_tensors_are_refused():
    with pytest.raises(PitcheckError, match="real"):
        metrics.orthonormality_loss(torch.ones((4, 2), dtype=torch.complex64))


def test_zero_and_rank_deficient_tables_get_a_reason_not_nan():
    Z, _ = pit_pair(40, 4, 1.0)
    with pytest.raises(PitcheckError, match="rank deficient"):
        metrics.pinv_error(np.zeros_like(Z), Z)
    pen = metrics.penrose_residuals(np.zeros_like(Z), Z)  # ABA = A holds exactly for A = 0
    assert pen["penrose_1"] == 0.0 and all(np.isfinite(v) for v in pen.values())
    with pytest.raises(PitcheckError, match="not finite"):
        metrics.orthonormality_loss(np.full((4, 2), 1e300))


def test_overflowing_condition_number_is_an_error_not_an_overflowerror():
    L = np.diag([1.0, 1e-160, 1.0])
    with pytest.raises(PitcheckError, match="not finite"):
        metrics.cholesky_conditioning(L, U)


def test_guarded_measurement_keeps_what_it_can():
    out = metrics.measure_guarded([(("a",), lambda: {"a": 1.0}),
                                   (("b", "c"), lambda: metrics.orthonormality_loss(np.full((2, 2), np.nan)))])
    assert out["a"] == 1.0 and np.isnan(out["b"]) and np.isnan(out["c"])
    assert len(out["unmeasured"]) == 1 and "non-finite" in out["unmeasured"][0]


def test_arbitrary_arrays_give_an_error_or_finite_values_and_never_hang():
    # in a child process: a hang inside LAPACK cannot be interrupted from Python, only killed
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "tests.fuzz_metrics", "150"], cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("no uncaught exception") == 4


@pytest.mark.parametrize("pivot", [0.0, -1.0, np.nan])
def test_the_reference_embedding_refuses_a_singular_factor_before_solving(pivot):
    Z, L = pit_pair(20, 3, 1.0)
    L[1, 1] = pivot
    with pytest.raises(PitcheckError, match="positive diagonal"):
        reference.embed(Z, L, [0, 1])
