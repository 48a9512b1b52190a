"""A small, correct Pseudo-Inverse Tying (PIT) head: the kind of module `pitcheck validate` and the
`target` key of a `pitcheck stress` scenario take.

    Z: V x D, orthonormal columns (kept on the manifold by post_step)
    T = L L^T, L lower triangular with a positive diagonal
    embed(ids) = T^{-1} z_v          (two triangular solves)
    logits(h)  = (h T) Z^T           so that W E = I

The factory signature is pitcheck's contract: make(vocab_size, hidden_size, *, dtype, device, seed).
Under bfloat16/float16 the parameters are fp32 masters and the solves run in fp32 (torch has no
half-precision triangular solve); outputs are in the asked dtype.
"""
import math

import torch
import torch.nn.functional as F

HALF = (torch.bfloat16, torch.float16)


def qr_sign(x):
    """Q of x's QR with the sign of each column fixed so that R's diagonal is positive."""
    q, r = torch.linalg.qr(x)
    return q * torch.where(torch.diagonal(r) < 0, -1.0, 1.0).to(q.dtype)


class PIT(torch.nn.Module):
    def __init__(self, vocab_size, hidden_size, *, dtype=torch.float32, device="cpu", seed=0):
        super().__init__()
        self.V, self.D, self.dtype = vocab_size, hidden_size, dtype
        self.master = torch.float32 if dtype in HALF else dtype
        gen = torch.Generator().manual_seed(seed)
        z = qr_sign(torch.randn(vocab_size, hidden_size, generator=gen, dtype=torch.float64))
        self.Z = torch.nn.Parameter(z.to(device, self.master))
        # softplus(raw) + 1e-6 = 1 on the diagonal: T = I at initialisation
        raw = math.log(math.expm1(1.0 - 1e-6))
        self.L_raw = torch.nn.Parameter(torch.eye(hidden_size, dtype=self.master, device=device) * raw)

    def factor(self):
        raw = self.L_raw
        return torch.tril(raw, -1) + torch.diag_embed(F.softplus(torch.diagonal(raw)) + 1e-6)

    def memory(self):
        # the model computes with Z as stored in the asked dtype (the fp32 master rounded, AMP-style)
        return self.Z.to(self.dtype).to(self.master) if self.dtype in HALF else self.Z

    def embed(self, ids):
        ids = torch.as_tensor(ids, device=self.Z.device)
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise ValueError(f"token ids must be integers, got {ids.dtype}")
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.V):
            raise IndexError(f"token id out of range [0, {self.V})")
        L = self.factor()
        rows = self.memory()[ids.reshape(-1)].T                      # D x B
        y = torch.linalg.solve_triangular(L, rows, upper=False)      # L y = z
        e = torch.linalg.solve_triangular(L.T, y, upper=True)        # L^T e = y
        return e.T.reshape(*ids.shape, self.D).to(self.dtype)

    def logits(self, h):
        L = self.factor()
        return (((h.to(self.master) @ L) @ L.T) @ self.memory().T).to(self.dtype)

    @torch.no_grad()
    def post_step(self):
        """Retract Z onto the orthonormal manifold after every optimizer step."""
        self.Z.copy_(qr_sign(self.Z))


def make(vocab_size, hidden_size, *, dtype=torch.float32, device="cpu", seed=0):
    return PIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
