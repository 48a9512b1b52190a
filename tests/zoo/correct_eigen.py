"""Correct, eigen convention with no post_step: T = Q diag(exp(s)) Q^T with Q = matrix_exp(A - A^T);
embed = z Q diag(exp(-s)) Q^T (no triangular solve). Z is a parametrisation computed in every forward
from an unconstrained V x D tensor X: Z = X (X^T X)^{-1/2} through a D x D eigh, so it is orthonormal by
construction and the optimizer may move X freely. Factor work in fp32 (or fp64) under half precision."""
import torch


class EigenPIT(torch.nn.Module):
    def __init__(self, vocab_size, hidden_size, *, dtype, device, seed):
        super().__init__()
        self.V, self.D, self.dtype = vocab_size, hidden_size, dtype
        self.fdtype = torch.float64 if dtype == torch.float64 else torch.float32
        g = torch.Generator().manual_seed(seed)
        q, r = torch.linalg.qr(torch.randn(vocab_size, hidden_size, generator=g, dtype=torch.float64))
        # X = Q S with distinct singular values: Z = polar(X) = Q is Haar, and the eigh backward, which divides
        # by gaps between eigenvalues of X^T X, stays well conditioned
        x = q * torch.sign(torch.diagonal(r)) * (1.0 + torch.arange(hidden_size, dtype=torch.float64) / hidden_size)
        self.X = torch.nn.Parameter(x.to(device, self.fdtype))
        self.A = torch.nn.Parameter(torch.zeros(hidden_size, hidden_size, device=device, dtype=self.fdtype))
        self.s = torch.nn.Parameter(torch.zeros(hidden_size, device=device, dtype=self.fdtype))

    def _polar(self):
        """(X^T X)^{-1/2} (D x D): Z = X times it, never formed for all rows unless needed."""
        G = self.X.T @ self.X
        w, U = torch.linalg.eigh(0.5 * (G + G.T))
        return (U * w.rsqrt()) @ U.T

    def _rows(self, M, X):
        z = X @ M
        return z.to(self.dtype).to(self.fdtype) if self.dtype != self.fdtype else z

    def _Q(self):
        return torch.linalg.matrix_exp(self.A - self.A.T)

    def embed(self, ids):
        ids = torch.as_tensor(ids, device=self.X.device)
        if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise ValueError(f"ids must be integer, got {ids.dtype}")
        if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < self.V):
            raise IndexError(f"ids out of range [0, {self.V})")
        z = self._rows(self._polar(), self.X[ids.reshape(-1)])
        Q = self._Q()
        e = ((z @ Q) * torch.exp(-self.s)) @ Q.T
        return e.reshape(*ids.shape, self.D).to(self.dtype)

    def logits(self, h):
        Q = self._Q()
        hT = ((h.to(self.fdtype) @ Q) * torch.exp(self.s)) @ Q.T
        Z = self._rows(self._polar(), self.X)
        return (hT @ Z.T).to(self.dtype)


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return EigenPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
