"""Reference torch PIT module: `PIT` and the factory `make` (the interface `pitcheck validate` judges).

Z (V x D) is the orthonormal token memory, kept on the Stiefel manifold by a named retraction from
pitcheck.model.retractions in `post_step()`. T = L L^T with L lower triangular and a positive diagonal
(softplus of a raw parameter plus a floor). Embedding rows e_v = T^{-1} z_v come from two triangular
solves on the rows in the batch only; logits = ((h L) L^T) Z^T. No V x V or D x V matrix is formed.

Under bfloat16/float16 the parameters are float32 masters: the memory is rounded to the asked dtype where
the model uses it (as autocast would), the solves run in float32 (torch has no half-precision triangular
solve) and outputs come back in the asked dtype.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..numerics.arrays import TorchOps
from .retractions import get_retraction, tangent_projection

HALF = (torch.bfloat16, torch.float16)
# Retractions that map any full-rank point to the manifold: applied to the stored Z with xi = 0.
PROJECTIVE = ("qr", "polar", "polar-gram", "polar-ns", "cholqr", "cholqr2")


def lower_factor(raw: torch.Tensor, min_diag: float) -> torch.Tensor:
    """Lower-triangular factor: strict lower part of raw, diagonal softplus(raw) + min_diag."""
    return torch.tril(raw, -1) + torch.diag_embed(F.softplus(torch.diagonal(raw)) + min_diag)


def memory_as_used(z: torch.Tensor, dtype, compute_dtype) -> torch.Tensor:
    """The memory as the model uses it: rounded to the asked dtype under mixed precision."""
    return z.to(dtype).to(compute_dtype) if dtype in HALF else z


def checked_ids(ids, vocab_size: int, device) -> torch.Tensor:
    """Integer token ids in [0, vocab_size), as a tensor on `device`; ValueError/IndexError otherwise."""
    ids = torch.as_tensor(ids, device=device)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"token ids must be an integer tensor, got dtype {ids.dtype}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise IndexError(f"token id out of range [0, {vocab_size}): min {int(ids.min())}, "
                         f"max {int(ids.max())}")
    return ids


class PIT(torch.nn.Module):
    """Pseudo-Inverse Tying: embed(ids) = rows of Z T^{-1}, logits(h) = (h T) Z^T, T = L L^T."""

    def __init__(self, vocab_size: int, hidden_size: int, *, dtype=torch.float32, device="cpu", seed: int = 0,
                 retraction: str = "qr", min_diag: float = 1e-6):
        super().__init__()
        if not (isinstance(vocab_size, int) and isinstance(hidden_size, int)) or hidden_size < 1:
            raise ValueError(f"vocab_size and hidden_size must be positive ints, got {vocab_size}, {hidden_size}")
        if vocab_size < hidden_size:
            raise ValueError(f"vocab_size={vocab_size} < hidden_size={hidden_size}: Z cannot have orthonormal columns")
        if dtype not in (torch.float64, torch.float32) + HALF:
            raise ValueError(f"unsupported dtype {dtype}")
        if not min_diag > 0:
            raise ValueError(f"min_diag must be positive, got {min_diag}")
        self._retract = get_retraction(retraction)  # unknown names fail here, not at the first step
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.dtype = dtype
        self.compute_dtype = torch.float32 if dtype in HALF else dtype  # master and solve dtype
        self.retraction, self.min_diag = retraction, float(min_diag)

        # Gaussian drawn and factored in float64 on the CPU: the same Z for a seed on every device and dtype.
        gen = torch.Generator().manual_seed(seed)
        g = torch.randn(vocab_size, hidden_size, generator=gen, dtype=torch.float64)
        z = get_retraction("qr")(g, torch.zeros_like(g), TorchOps())
        self.Z = torch.nn.Parameter(z.to(device=device, dtype=self.compute_dtype))
        # raw diagonal r with softplus(r) + min_diag = 1, so T = I at initialisation
        r = math.log(math.expm1(1.0 - self.min_diag)) if self.min_diag < 1 else 0.0
        self.L_raw = torch.nn.Parameter(torch.eye(hidden_size, dtype=self.compute_dtype, device=device) * r)
        if retraction not in PROJECTIVE:
            # Cayley-type retractions move from the previous point along the optimizer's (projected) move;
            # the previous point is state, so it is a buffer and survives a state_dict round trip.
            self.register_buffer("Z_prev", self.Z.detach().clone())

    @property
    def L(self) -> torch.Tensor:
        return lower_factor(self.L_raw, self.min_diag)

    def _memory(self, z: torch.Tensor) -> torch.Tensor:
        return memory_as_used(z, self.dtype, self.compute_dtype)

    def _check_ids(self, ids) -> torch.Tensor:
        return checked_ids(ids, self.vocab_size, self.Z.device)

    def embed(self, ids) -> torch.Tensor:
        """Rows e_v = T^{-1} z_v for ids of any shape (...): returns (..., D) in the asked dtype."""
        ids = self._check_ids(ids)
        rhs = self._memory(self.Z[ids.reshape(-1)]).T  # D x B: only the rows in the batch
        L = self.L
        y = torch.linalg.solve_triangular(L, rhs, upper=False)  # L y = z
        e = torch.linalg.solve_triangular(L.T, y, upper=True)  # L^T e = y
        return e.T.reshape(*ids.shape, self.hidden_size).to(self.dtype)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(h T) Z^T for h of shape (..., D): returns (..., V). Row-wise, so a non-finite row stays in its row."""
        if h.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden states must have last dimension {self.hidden_size}, got shape {tuple(h.shape)}")
        L = self.L
        hc = h.to(self.compute_dtype)
        return (((hc @ L) @ L.T) @ self._memory(self.Z).T).to(self.dtype)

    @torch.no_grad()
    def post_step(self) -> None:
        """Put Z back on the manifold after an optimizer step, with the retraction named at construction."""
        ops = TorchOps()
        Z = self.Z
        if self.retraction in PROJECTIVE:
            new = self._retract(Z, torch.zeros_like(Z), ops)
        else:
            base = self.Z_prev
            new = self._retract(base, tangent_projection(base, Z - base, ops), ops)
            self.Z_prev.copy_(new)
        Z.copy_(new)

    def extra_repr(self) -> str:
        return (f"vocab_size={self.vocab_size}, hidden_size={self.hidden_size}, dtype={self.dtype}, "
                f"retraction={self.retraction!r}, min_diag={self.min_diag:g}")


def make(vocab_size: int, hidden_size: int, *, dtype=torch.float32, device="cpu", seed: int = 0,
         retraction: str = "qr", min_diag: float = 1e-6) -> PIT:
    """Factory with the signature `pitcheck validate` calls."""
    return PIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed, retraction=retraction,
               min_diag=min_diag)
