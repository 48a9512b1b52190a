"""The interface metrics of torch tensors, computed where they live: the O(V D^2) products in float64 on the
tensors' device, and the 256 sampled rows' reference solves there too wherever float64 is fine enough for the
run's u (else in extended precision on the host); the D x D factorisations and the ratios on the host, as
pitcheck.numerics.metrics computes them.

So a record on a GPU moves D x D matrices, three blocks of the sampled rows and scalars to the host, never a
V x D table. The same code runs on CPU tensors (a torch backend's run on the CPU), which is where it is tested
against the numpy form. Arguments that the host form would refuse (non-finite entries, a singular L) are
refused here with a PitcheckError too, and so is a device that runs out of memory for the float64 copies
(a CUDA out-of-memory error), so a caller can fall back to the host form's per-part measurement.
"""
from __future__ import annotations

import functools

import numpy as np

from ..infra.errors import PitcheckError
from . import metrics

FLOAT64_BITS = 53


class TorchWork:
    """metrics.HostWork's products on float64 torch tensors, on their device; small operands come from
    and go to the host as numpy arrays."""

    def __init__(self, like):
        self.device = like.device

    def _small(self, A: np.ndarray):
        import torch

        return torch.from_numpy(np.ascontiguousarray(A, dtype=np.float64)).to(self.device)

    @staticmethod
    def gram(X, Y=None) -> np.ndarray:
        return (X.T @ (X if Y is None else Y)).cpu().numpy()

    def times(self, X, A: np.ndarray):
        return X @ self._small(A)

    @staticmethod
    def minus(X, Y):
        return X - Y

    @staticmethod
    def norm(X) -> np.float64:
        import torch

        return np.float64(torch.linalg.vector_norm(X).item())

    @staticmethod
    def finite(X) -> bool:
        import torch

        return bool(torch.isfinite(X).all())

    @staticmethod
    def householder(X) -> tuple:
        import torch

        Q, R = torch.linalg.qr(X)
        return Q, R.cpu().numpy()

    def rows(self, X, ids: np.ndarray):
        """The sampled rows, where X lives."""
        import torch

        return X[torch.from_numpy(ids).to(self.device)]

    @staticmethod
    def host(X) -> np.ndarray:
        return X.cpu().numpy()

    def yardstick(self, Z_rows, L: np.ndarray, E_rows, u: float) -> tuple:
        """The sampled rows' reference solves and residuals in float64 where the rows live, wherever float64 is
        finer than u by the 16 that the trisolve metrics ask of a yardstick (fp32 and coarser); for finer u,
        in extended precision on the host (metrics.extended_yardstick)."""
        import torch

        if 2.0**-FLOAT64_BITS > u / 16:
            return metrics.extended_yardstick(self.host(Z_rows), L, self.host(E_rows))
        Lt = self._small(L)
        y = torch.linalg.solve_triangular(Lt, Z_rows.T, upper=False)
        exact = torch.linalg.solve_triangular(Lt.T, y, upper=True).T
        resid = Z_rows - (E_rows @ Lt) @ Lt.T
        return self.host(exact), self.host(resid), FLOAT64_BITS


def memory_refused(measure):
    """A device out of memory for the float64 copies (seven V x D buffers: 1.6 GB at 49152 x 576) is a
    PitcheckError, after which the host form measures from host copies."""
    @functools.wraps(measure)
    def refusing(*args, **kwargs):
        import torch

        try:
            return measure(*args, **kwargs)
        except torch.cuda.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            raise PitcheckError(f"the device ran out of memory for the metrics' float64 copies "
                                f"({(str(exc).splitlines() or [''])[0]})") from None

    return refusing


def _float64(x, name: str, like=None):
    import torch

    if not isinstance(x, torch.Tensor):
        raise PitcheckError(f"{name} must be a torch tensor here, got {type(x).__name__}")
    if like is not None and x.device != like.device:
        raise PitcheckError(f"{name} is on {x.device}, Z on {like.device}: the metrics need one device")
    if x.is_complex() or x.dtype == torch.bool:
        raise PitcheckError(f"{name} must be a real array, got a {x.dtype} tensor")
    if x.ndim != 2 or x.numel() == 0:
        raise PitcheckError(f"{name} must be a non-empty 2-D matrix, got shape {tuple(x.shape)}")
    return x.detach().to(torch.float64)


def _all_finite(named: dict) -> None:
    """One read for every table (a record's reads are few, not free)."""
    import torch

    flags = torch.stack([torch.isfinite(x).all() for x in named.values()]).cpu().numpy()
    for name, ok in zip(named, flags):
        if not ok:
            raise PitcheckError(f"{name} has non-finite entries (NaN or inf): its metrics are undefined")


@memory_refused
def interface_metrics(Z, L, E, u: float, factor_u: float | None = None, sample_rows: int = 256, B=None,
                      solve_u: float | None = None) -> dict:
    """metrics.interface_metrics of torch tensors Z, E (and B; default Z T) on their device, L anywhere."""
    Z = _float64(Z, "Z")
    E = _float64(E, "E", like=Z)
    L, u, factor_u = metrics.checked_settings(Z.shape, metrics.as_matrix(L, "L"), E.shape, u, factor_u, sample_rows)
    solve_u = u if solve_u is None else metrics.unit_roundoff(solve_u, "solve_u")
    work = TorchWork(Z)
    if B is None:
        T = L @ L.T  # on the host in float64, as the numpy form forms it
        B = work.times(Z, T)
    B = _float64(B, "B", like=Z)
    if B.shape != E.shape:
        raise PitcheckError(f"shape mismatch: E and B are {tuple(E.shape)} and {tuple(B.shape)}")
    _all_finite({"Z": Z, "E": E, "B": B})
    return metrics.checked_interface_metrics(Z, L, E, B, u, factor_u, sample_rows, work, solve_u=solve_u)


@memory_refused
def head_metrics(E, B) -> dict:
    """metrics.head_metrics of torch tensors on their device."""
    E = _float64(E, "E")
    B = _float64(B, "B", like=E)
    if E.shape != B.shape:
        raise PitcheckError(f"shape mismatch: E and B are {tuple(E.shape)} and {tuple(B.shape)}")
    _all_finite({"E": E, "B": B})
    return metrics.checked_head_metrics(E, B, TorchWork(E))


@memory_refused
def orthonormality(Z, u: float) -> dict:
    """metrics.orthonormality_loss and orthonormality_ratio of a torch tensor, from one Gram on its device."""
    Z = _float64(Z, "Z")
    _all_finite({"Z": Z})
    return metrics.checked_orthonormality(Z, metrics.unit_roundoff(u), TorchWork(Z))


def relative_distance(A, A_ref) -> float:
    """||A - A_ref||_F / ||A_ref||_F in float64 on the tensors' device (one scalar read)."""
    import torch

    A, A_ref = A.detach().to(torch.float64), A_ref.detach().to(device=A.device, dtype=torch.float64)
    return float(torch.linalg.vector_norm(A - A_ref) / torch.linalg.vector_norm(A_ref))
