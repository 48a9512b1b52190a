"""Correct, Wen and Yin's Cayley transform as their paper writes it: W = G X^T - X G^T with G the
optimizer's move from the last point X, Y = (I - W/2)^{-1} (I + W/2) X by the low-rank (Woodbury) form.
W X = G - X G^T X doubles the in-span (skew) part of a tangent move: a retraction for the canonical metric
<A, B> = tr(A^T (I - X X^T / 2) B), not the embedded one (correct_cayley projects the move first). Z stays
orthonormal to rounding: the Cayley transform of a skew W is orthogonal."""
import torch

from .correct_cayley import CayleyPIT


class CanonicalCayleyPIT(CayleyPIT):
    @torch.no_grad()
    def post_step(self):
        X = self.anchor
        G = self.Z - X
        U = torch.cat([G, X], 1)  # W = U V^T with V = [X, -G]
        Vm = torch.cat([X, -G], 1)
        eye = torch.eye(2 * self.dim, dtype=X.dtype, device=X.device)
        Y = X + U @ torch.linalg.solve(eye - 0.5 * (Vm.T @ U), Vm.T @ X)
        self.Z.copy_(Y)
        self.anchor.copy_(Y)


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return CanonicalCayleyPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
