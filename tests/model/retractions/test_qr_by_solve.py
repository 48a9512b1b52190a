"""`qr` on large CPU matrices forms Q as Y R^{-1} from Householder's R: the positive-diagonal
QR factor to rounding, as orthogonal as orgqr's near the manifold, orgqr's own Q where Y is far from
orthonormal or the arithmetic is emulated, and the stacked form the same bits as the one-matrix map."""
import numpy as np
import pytest
import torch

from pitcheck.model.retractions import qr as R
from pitcheck.numerics.arrays import NumpyOps, TorchOps
from pitcheck.model.retractions import StackedOps, stacked_qr
from pitcheck.numerics.formats import get_format
from pitcheck.model.retractions import QR_BY_SOLVE_MIN_ELEMENTS, retract_qr, tangent_projection

V, D = 2048, 32  # V x D = QR_BY_SOLVE_MIN_ELEMENTS: the smallest shape that takes the solve


def _point(scale=1e-2, seed=0, V=V, D=D):
    rng = np.random.default_rng(seed)
    q, r = np.linalg.qr(rng.standard_normal((V, D)))
    Z = q * np.sign(np.diag(r))
    xi = tangent_projection(Z, rng.standard_normal((V, D)))
    return Z, xi * (scale * np.sqrt(D) / np.linalg.norm(xi))


def _ill_conditioned(cond, seed=2):
    """Y = U diag(s) W^T with singular values from 1 to 1/cond."""
    rng = np.random.default_rng(seed)
    U = np.linalg.qr(rng.standard_normal((V, D)))[0]
    W = np.linalg.qr(rng.standard_normal((D, D)))[0]
    return (U * np.geomspace(1.0, 1.0 / cond, D)) @ W.T


def _householder(Y):
    """The positive-diagonal Householder QR factor by orgqr (what qr computes below the size rule)."""
    Q, Rf = np.linalg.qr(np.asarray(Y, dtype=np.float64))
    return Q * np.sign(np.diag(Rf))


def _orthonormality_ratio(Q, u):
    Q = np.asarray(Q, dtype=np.float64)
    return np.linalg.norm(Q.T @ Q - np.eye(Q.shape[1]), 1) / (Q.shape[0] * u)


class _Spy:
    """Counts the Ops calls that tell the two paths apart: householder_r (the solve) and qr (orgqr)."""

    def __init__(self, ops):
        self.ops, self.calls = ops, []

    def __getattr__(self, name):
        attr = getattr(self.ops, name)
        if name in ("qr", "householder_r"):
            def counted(*a, **k):
                self.calls.append(name)
                return attr(*a, **k)
            return counted
        return attr


def _ops(backend, dtype=torch.float32):
    return NumpyOps() if backend == "numpy" else TorchOps()


def _as(backend, dtype, *xs):
    if backend == "numpy":
        return xs
    return tuple(torch.from_numpy(np.ascontiguousarray(x)).to(dtype) for x in xs)


CASES = [("numpy", torch.float64, 2.0**-53), ("torch", torch.float64, 2.0**-53), ("torch", torch.float32, 2.0**-24)]


@pytest.mark.parametrize("backend,dtype,u", CASES)
def test_a_large_matrix_near_the_manifold_takes_the_solve_and_gets_householders_q(backend, dtype, u):
    Z, xi = _point()
    spy = _Spy(_ops(backend))
    Q = retract_qr(*_as(backend, dtype, Z, xi), spy)
    assert spy.calls == ["householder_r"]
    Qn = np.asarray(Q, dtype=np.float64)
    # the same factor to rounding: the QR factor of a well-conditioned Y is perturbed like cond(Y) u
    assert np.abs(Qn - _householder(Z + xi)).max() < 64 * u
    assert _orthonormality_ratio(Qn, u) < 0.1  # LAPACK's dqrt01 passes below 30; orgqr's is ~0.005 here
    assert (Q.is_contiguous() if backend == "torch" else Q.flags.c_contiguous)


@pytest.mark.parametrize("backend,dtype,u", CASES)
def test_qr_by_solve_agrees_with_z_plus_t_xi_to_first_order(backend, dtype, u):
    Z, xi = _point(scale=1.0)
    errors = []
    for t in (1e-2, 5e-3):
        Q = retract_qr(*_as(backend, dtype, Z, t * xi), _ops(backend))
        errors.append(np.linalg.norm(np.asarray(Q, dtype=np.float64) - (Z + t * xi)))
    assert 3.0 < errors[0] / errors[1] < 5.0  # second order: halving t quarters the error


@pytest.mark.parametrize("backend,dtype,u", CASES)
def test_a_point_far_from_orthonormal_gets_orgqrs_q(backend, dtype, u):
    """At cond(Y) = 10^5 Y R^{-1} would lose orthogonality like cond(Y) u (measured: 40 V u in fp32 at
    8192 x 128); the guard hands such a Y to orgqr, which keeps Householder's O(u)."""
    Y = _ill_conditioned(1e5)
    spy = _Spy(_ops(backend))
    Q = retract_qr(*_as(backend, dtype, Y, np.zeros_like(Y)), spy)
    assert spy.calls == ["householder_r", "qr"]
    assert _orthonormality_ratio(Q, u) < 1.0
    if backend == "numpy":  # orgqr's path, bit for bit
        np.testing.assert_array_equal(Q, _householder(Y))


def test_the_guard_is_what_keeps_an_ill_conditioned_point_orthogonal(monkeypatch):
    """The same point with the guard lifted: the solve's Q is measurably less orthogonal (the check above
    can fail)."""
    monkeypatch.setattr(R, "QR_BY_SOLVE_MAX_GRAM_DEVIATION", float("inf"))
    Y = torch.from_numpy(_ill_conditioned(1e5)).float()
    assert _orthonormality_ratio(retract_qr(Y, torch.zeros_like(Y), TorchOps()), 2.0**-24) > 1.0


@pytest.mark.parametrize("why,ops,dtype,shape", [
    ("below the size rule", TorchOps(), torch.float32, (V // 2, D)),
    ("tf32's emulated matmuls", TorchOps(matmul_format=get_format("tf32")), torch.float32, (V, D)),
    ("half-precision matmuls", TorchOps(matmul_dtype=torch.bfloat16, native=False), torch.float32, (V, D)),
    ("numpy float32", NumpyOps(), np.float32, (V, D)),
])
def test_where_the_solve_does_not_apply_q_is_orgqrs_bit_for_bit(why, ops, dtype, shape):
    Z, xi = _point(V=shape[0], D=shape[1])
    if isinstance(ops, NumpyOps):
        Z, xi = Z.astype(dtype), xi.astype(dtype)
    else:
        Z, xi = (torch.from_numpy(x).to(dtype) for x in (Z, xi))
    spy = _Spy(ops)
    Q = retract_qr(Z, xi, spy)
    assert spy.calls == ["qr"], why
    Qo, Rf = ops.qr(Z + xi)
    expected = Qo * ops.sign_nonzero(ops.diag(Rf))
    assert (Q == expected).all(), why


def test_qr_by_solve_needs_a_shape_of_at_least_the_rule():
    assert V * D == QR_BY_SOLVE_MIN_ELEMENTS


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_the_stacked_qr_of_large_matrices_is_the_one_matrix_map_bit_for_bit(backend):
    points = [_point(seed=s) for s in range(2)] + [(_ill_conditioned(1e5), np.zeros((V, D)))]
    Z = np.stack([p[0] for p in points])
    xi = np.stack([p[1] for p in points])
    base = NumpyOps() if backend == "numpy" else TorchOps()
    if backend == "torch":
        Z, xi = torch.from_numpy(Z).float(), torch.from_numpy(xi).float()
    Q, failed = stacked_qr(Z, xi, StackedOps(base))
    assert not failed.any()
    for k in range(len(points)):
        assert (Q[k] == retract_qr(Z[k], xi[k], base)).all()


def test_householder_r_is_householder_qrs_r_bit_for_bit():
    from pitcheck.numerics.arrays import householder_qr, householder_r

    Y = sum(_point())
    np.testing.assert_array_equal(householder_r(Y), householder_qr(Y)[1])
    Yt = torch.from_numpy(Y).float()
    assert (TorchOps().householder_r(Yt) == torch.linalg.qr(Yt)[1]).all()
