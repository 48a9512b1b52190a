"""TorchOps runs the SVD and eigh of lower-precision tensors in float64 on the devices FLOAT64_FACTORS_ON names
(CUDA, whose single-precision solvers left polar and polar-gram 1e2x further from the manifold than LAPACK).
The CPU keeps LAPACK in the tensor's dtype, bit for bit; the float64 route is tested here on CPU tensors by
naming the CPU, so the code CUDA runs is the code these tests judge."""
import numpy as np
import pytest
import torch

from pitcheck.model.retractions import get_retraction
from pitcheck.numerics.arrays import TorchOps

U32 = 2.0 ** -24


@pytest.fixture
def float64_on_cpu(monkeypatch):
    monkeypatch.setattr(TorchOps, "FLOAT64_FACTORS_ON", frozenset({"cpu"}))


def _tall(V=300, D=12, seed=0, cond=1e3):
    rng = np.random.default_rng(seed)
    Q1, _ = np.linalg.qr(rng.standard_normal((V, D)))
    Q2, _ = np.linalg.qr(rng.standard_normal((D, D)))
    return Q1 @ np.diag(np.logspace(0, -np.log10(cond), D)) @ Q2.T


def _gap(U):
    U = U.double()
    return float(torch.linalg.norm(U.mT @ U - torch.eye(U.shape[-1], dtype=torch.float64)))


def test_the_cpu_keeps_lapack_in_the_tensors_dtype_bit_for_bit():
    X = torch.tensor(_tall(), dtype=torch.float32)
    ops = TorchOps()
    for ours, theirs in zip(ops.svd(X), torch.linalg.svd(X, full_matrices=False)):
        assert torch.equal(ours, theirs)
    G = X.T @ X
    for ours, theirs in zip(ops.eigh(G), torch.linalg.eigh(G)):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("shape", [(300, 12), (12, 12), (5, 300, 12)])
def test_svd_in_float64_is_an_svd_in_the_tensors_dtype(float64_on_cpu, shape):
    x64 = np.stack([_tall(*shape[-2:], seed=s) for s in range(shape[0])]) if len(shape) == 3 else _tall(*shape)
    X = torch.tensor(x64, dtype=torch.float32)
    U, S, Vh = TorchOps().svd(X)
    assert U.dtype == S.dtype == Vh.dtype == torch.float32
    assert U.shape == X.shape and S.shape == X.shape[:-1][:-1] + (X.shape[-1],)
    D = X.shape[-1]
    # orthonormal factors to a few u of float32 (a float64 U cast to float32 is within sqrt(D) u of orthonormal;
    # the tall route's Q adds Householder QR's own error, a small multiple of D u)
    for k in range(X.shape[0] if X.dim() == 3 else 1):
        Uk, Vk = (U[k], Vh[k]) if X.dim() == 3 else (U, Vh)
        assert _gap(Uk) < 4 * D * U32 and _gap(Vk.mT) < 4 * D * U32
    # U S Vh reconstructs X to its backward error, relative to ||X||
    back = (U.double() * S.double().unsqueeze(-2)) @ Vh.double()
    rel = float(torch.linalg.norm(back - X.double()) / torch.linalg.norm(X.double()))
    assert rel < 4 * D * U32
    # the singular values are float64's of X, rounded
    exact = np.linalg.svd(X.double().numpy(), compute_uv=False)
    assert np.allclose(S.double().numpy(), exact, rtol=8 * U32, atol=8 * U32 * exact.max())


def test_eigh_in_float64_rounds_float64s_eigenpairs(float64_on_cpu):
    X = torch.tensor(_tall(), dtype=torch.float32)
    G = X.T @ X
    w, Q = TorchOps().eigh(G)
    assert w.dtype == Q.dtype == torch.float32
    w64, Q64 = torch.linalg.eigh(G.double())
    assert torch.equal(w, w64.float()) and torch.equal(Q, Q64.float())


@pytest.mark.parametrize("name", ["polar", "polar-gram"])
def test_polar_through_float64_factors_lands_at_float32s_floor(float64_on_cpu, name):
    rng = np.random.default_rng(3)
    V, D = 2000, 32
    Z = np.linalg.qr(rng.standard_normal((V, D)))[0]
    xi = 0.1 * rng.standard_normal((V, D))
    xi -= Z @ ((Z.T @ xi + xi.T @ Z) / 2)  # a tangent step
    Y = torch.tensor(Z + xi, dtype=torch.float32)
    out = get_retraction(name)(Y, torch.zeros_like(Y), TorchOps())
    # within a small multiple of the floor of an exactly orthonormal V x D matrix rounded to float32 (about
    # sqrt(D) u_32 in the Frobenius norm), as LAPACK on the CPU lands
    assert out.dtype == torch.float32 and _gap(out) < 8 * D * U32
    U, _, Vt = np.linalg.svd(Z + xi, full_matrices=False)
    assert float(np.linalg.norm(out.double().numpy() - U @ Vt)) < 8 * D * U32
