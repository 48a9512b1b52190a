"""Correct, storage in the asked dtype: Z and L's raw parameter are kept as tensors of the requested dtype
(bfloat16 under a bfloat16 request, no float32 master), gathered with F.embedding, and upcast to float32 for
the solves and the head (torch has no half-precision triangular solve). Its memory sits at the format's
storage floor (||Z^T Z - I||_2 ~ 6e-4 in bfloat16). `make_frozen` keeps Z fixed after initialisation, as
the first version of PIT does: nothing retracts it and nothing needs to."""
import torch
import torch.nn.functional as F

from ._base import HALF, qr_sign


class HalfStoragePIT(torch.nn.Module):
    def __init__(self, vocab_size, hidden_size, *, dtype, device, seed, frozen=False):
        super().__init__()
        self.V, self.D, self.dtype = vocab_size, hidden_size, dtype
        self.work = torch.float32 if dtype in HALF else dtype
        gen = torch.Generator().manual_seed(seed)
        z = qr_sign(torch.randn(vocab_size, hidden_size, generator=gen, dtype=torch.float64))
        self.Z = torch.nn.Parameter(z.to(device, dtype), requires_grad=not frozen)
        self.raw = torch.nn.Parameter(torch.zeros(hidden_size, hidden_size, dtype=dtype, device=device))

    def factor(self):
        raw = self.raw.to(self.work)
        return torch.tril(raw, -1) + torch.diag_embed(torch.exp(torch.diagonal(raw)))

    def embed(self, ids):
        ids = torch.as_tensor(ids, device=self.Z.device)
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise ValueError(f"token ids must be integers, got {ids.dtype}")
        rows = F.embedding(ids.reshape(-1), self.Z).to(self.work)
        L = self.factor()
        y = torch.linalg.solve_triangular(L, rows.T, upper=False)
        e = torch.linalg.solve_triangular(L.T, y, upper=True).T
        return e.reshape(*ids.shape, self.D).to(self.dtype)

    def logits(self, h):
        L = self.factor()
        return ((h.to(self.work) @ L) @ L.T @ self.Z.to(self.work).T).to(self.dtype)

    @torch.no_grad()
    def post_step(self):
        if self.Z.requires_grad:
            self.Z.copy_(qr_sign(self.Z.to(self.work)).to(self.dtype))


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return HalfStoragePIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)


def make_frozen(vocab_size, hidden_size, *, dtype, device, seed):
    return HalfStoragePIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed, frozen=True)
