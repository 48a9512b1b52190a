"""Correct, Cayley convention: T = L L^T with diagonal softplus(raw) + 1e-6. After each optimizer step,
post_step replaces the optimizer's move of Z by a low-rank Cayley (Wen & Yin 2013) retraction from the
previous point along the move's tangent projection, O(V D^2) with one 2D x 2D solve. Cayley error
accumulates, so a drift guard re-orthonormalises by QR when ||Z^T Z - I||_F exceeds 50 D u (OptM style).
The previous point is a buffer, so a state_dict round trip keeps it."""
import torch
import torch.nn.functional as F


class CayleyPIT(torch.nn.Module):
    def __init__(self, vocab_size, hidden_size, *, dtype, device, seed):
        super().__init__()
        self.vocab, self.dim, self.dtype = vocab_size, hidden_size, dtype
        self.mdtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
        gen = torch.Generator().manual_seed(seed)
        q, r = torch.linalg.qr(torch.randn(vocab_size, hidden_size, generator=gen, dtype=torch.float64))
        q = q * torch.where(torch.diagonal(r) < 0, -1.0, 1.0).to(q.dtype)
        self.Z = torch.nn.Parameter(q.to(device, self.mdtype))
        self.register_buffer("anchor", self.Z.detach().clone())
        raw0 = torch.log(torch.expm1(torch.tensor(1.0 - 1e-6, dtype=torch.float64)))
        self.raw = torch.nn.Parameter(torch.diag(raw0.repeat(hidden_size)).to(device, self.mdtype))

    def L(self):
        return torch.tril(self.raw, -1) + torch.diag(F.softplus(self.raw.diagonal()) + 1e-6)

    def _used(self, z):
        return z.to(self.dtype).to(self.mdtype) if self.dtype != self.mdtype else z

    def embed(self, ids):
        if not isinstance(ids, torch.Tensor):
            ids = torch.tensor(ids)
        if torch.is_floating_point(ids) or ids.dtype in (torch.bool, torch.complex64, torch.complex128):
            raise ValueError(f"expected integer token ids, got {ids.dtype}")
        flat = ids.reshape(-1).to(self.Z.device)
        if flat.numel() and bool(((flat < 0) | (flat >= self.vocab)).any()):
            raise IndexError(f"token id outside [0, {self.vocab})")
        L = self.L()
        y = torch.linalg.solve_triangular(L, self._used(self.Z[flat]).T, upper=False)
        e = torch.linalg.solve_triangular(L.T, y, upper=True).T
        return e.reshape(*ids.shape, self.dim).to(self.dtype)

    def logits(self, h):
        L = self.L()
        return ((h.to(self.mdtype) @ L @ L.T) @ self._used(self.Z).T).to(self.dtype)

    @torch.no_grad()
    def post_step(self):
        X = self.anchor
        move = self.Z - X
        XtM = X.T @ move
        xi = move - X @ (0.5 * (XtM + XtM.T))  # tangent projection at X
        g = xi - 0.5 * X @ (X.T @ xi)  # W = g X^T - X g^T has W X = xi
        U = torch.cat([g, X], 1)  # W = U V^T with V = [X, -g]
        Vm = torch.cat([X, -g], 1)
        K = torch.linalg.solve(torch.eye(2 * self.dim, dtype=X.dtype, device=X.device) - 0.5 * (Vm.T @ U), Vm.T @ X)
        Y = X + U @ K
        eye = torch.eye(self.dim, dtype=Y.dtype, device=Y.device)
        if torch.linalg.norm(Y.T @ Y - eye) > 50 * self.dim * torch.finfo(Y.dtype).eps / 2:
            q, r = torch.linalg.qr(Y)
            Y = q * torch.where(torch.diagonal(r) < 0, -1.0, 1.0).to(q.dtype)
        self.Z.copy_(Y)
        self.anchor.copy_(Y)


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return CayleyPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
