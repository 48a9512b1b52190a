"""The reference PIT module (pitcheck.nn.PIT) holding a given Z and L instead of its random start."""
from __future__ import annotations

import numpy as np
import torch

from ...model.nn import PIT
from ...numerics.reference import softplus_inverse


def pit_from(Z: np.ndarray, L: np.ndarray, *, dtype=torch.float32, device="cpu", retraction: str = "qr",
             min_diag: float = 1e-6) -> PIT:
    """nn.PIT holding this Z and this L (its raw diagonal set so that softplus(raw) + min_diag = diag L)."""
    vocab, dim = Z.shape
    module = PIT(vocab, dim, dtype=dtype, device=device, retraction=retraction, min_diag=min_diag)
    raw = np.tril(L, -1) + np.diag(softplus_inverse(np.diag(L) - min_diag))
    with torch.no_grad():
        module.Z.copy_(torch.from_numpy(np.ascontiguousarray(Z, dtype=np.float64)))
        module.L_raw.copy_(torch.from_numpy(raw))
        if hasattr(module, "Z_prev"):
            module.Z_prev.copy_(module.Z)
    return module
