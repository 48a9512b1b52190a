"""Correct: T = L L^T with L lower and an exp-parametrised diagonal; Z retracted by sign-fixed
Householder QR in post_step. Two triangular solves per embedded row; fp32 masters under half precision."""
import torch

_HALF = (torch.bfloat16, torch.float16)


class CholeskyQRPIT(torch.nn.Module):
    def __init__(self, vocab_size, hidden_size, *, dtype, device, seed):
        super().__init__()
        self.vocab_size, self.hidden_size, self.out_dtype = vocab_size, hidden_size, dtype
        self.work = torch.float32 if dtype in _HALF else dtype
        g = torch.Generator().manual_seed(seed)
        q, r = torch.linalg.qr(torch.randn(vocab_size, hidden_size, generator=g, dtype=torch.float64))
        q = q * torch.sign(torch.diagonal(r))
        self.memory = torch.nn.Parameter(q.to(device=device, dtype=self.work))
        self.log_diag = torch.nn.Parameter(torch.zeros(hidden_size, dtype=self.work, device=device))
        self.lower = torch.nn.Parameter(torch.zeros(hidden_size, hidden_size, dtype=self.work, device=device))

    def chol(self):
        return torch.tril(self.lower, -1) + torch.diag(torch.exp(self.log_diag))

    def _z(self):
        z = self.memory
        return z.to(self.out_dtype).to(self.work) if self.out_dtype in _HALF else z

    def embed(self, ids):
        if not torch.is_tensor(ids) or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError("ids must be an integer tensor")
        if ids.numel() and (ids.min().item() < 0 or ids.max().item() >= self.vocab_size):
            raise IndexError(f"ids must lie in [0, {self.vocab_size})")
        L = self.chol()
        z = self._z()[ids.flatten()].T
        y = torch.linalg.solve_triangular(L, z, upper=False)
        e = torch.linalg.solve_triangular(L.mT, y, upper=True)
        return e.T.reshape(ids.shape + (self.hidden_size,)).to(self.out_dtype)

    def logits(self, h):
        L = self.chol()
        return (((h.to(self.work) @ L) @ L.mT) @ self._z().T).to(self.out_dtype)

    @torch.no_grad()
    def post_step(self):
        q, r = torch.linalg.qr(self.memory)
        d = torch.diagonal(r)
        self.memory.copy_(q * torch.where(d < 0, -1.0, 1.0).to(q.dtype))


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return CholeskyQRPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
