"""A plain, correct L L^T PIT module that the broken zoo entries subclass, each overriding one piece.

T = L L^T, L lower with diagonal softplus(raw) + 1e-6; Z initialised by sign-fixed QR and retracted by
QR in post_step; fp32 masters and fp32 solves under bfloat16/float16, outputs in the asked dtype.
"""
import math

import torch
import torch.nn.functional as F

HALF = (torch.bfloat16, torch.float16)


def qr_sign(x):
    q, r = torch.linalg.qr(x)
    return q * torch.where(torch.diagonal(r) < 0, -1.0, 1.0).to(q.dtype)


class LLtPIT(torch.nn.Module):
    raw_diag_init = math.log(math.expm1(1.0 - 1e-6))  # softplus(raw) + 1e-6 = 1: T = I at init

    def __init__(self, vocab_size, hidden_size, *, dtype=torch.float32, device="cpu", seed=0):
        super().__init__()
        self.V, self.D, self.dtype = vocab_size, hidden_size, dtype
        self.master = torch.float32 if dtype in HALF else dtype
        gen = torch.Generator().manual_seed(seed)
        self.Z = torch.nn.Parameter(self.init_memory(vocab_size, hidden_size, gen).to(device, self.master))
        self.L_raw = torch.nn.Parameter(
            torch.eye(hidden_size, dtype=self.master, device=device) * self.raw_diag_init)

    def init_memory(self, V, D, gen):
        return qr_sign(torch.randn(V, D, generator=gen, dtype=torch.float64))

    def factor(self):
        raw = self.L_raw
        return torch.tril(raw, -1) + torch.diag_embed(F.softplus(torch.diagonal(raw)) + 1e-6)

    def check_ids(self, ids):
        ids = torch.as_tensor(ids, device=self.Z.device)
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise ValueError(f"token ids must be integers, got {ids.dtype}")
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.V):
            raise IndexError(f"token id out of range [0, {self.V})")
        return ids

    def memory(self):
        # AMP-style: the fp32 master is rounded to the asked dtype where the model uses it
        return self.Z.to(self.dtype).to(self.master) if self.dtype in HALF else self.Z

    def solve(self, L, rhs):
        """T^{-1} rhs for a D x B right-hand side: L y = rhs, then L^T x = y."""
        y = torch.linalg.solve_triangular(L, rhs, upper=False)
        return torch.linalg.solve_triangular(L.T, y, upper=True)

    def embed(self, ids):
        ids = self.check_ids(ids)
        rows = self.memory()[ids.reshape(-1)]
        e = self.solve(self.factor(), rows.T).T
        return e.reshape(*ids.shape, self.D).to(self.dtype)

    def head(self, h, L):
        return ((h @ L) @ L.T) @ self.memory().T

    def logits(self, h):
        return self.head(h.to(self.master), self.factor()).to(self.dtype)

    @torch.no_grad()
    def post_step(self):
        self.Z.copy_(qr_sign(self.Z))
