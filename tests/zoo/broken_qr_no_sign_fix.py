"""Broken: post_step re-orthonormalises Z by Householder QR and keeps Q as it comes, without the sign fix
(Q diag(sign(diag R))). Householder QR makes R's diagonal negative where the pivot entry is positive, so
columns of Z flip sign at every step: the interface W E = I stays exact, but Z jumps by O(1) where the
optimizer moved it by O(lr). Caught by `retraction` (post_step moves a point of the manifold)."""
import torch

from ._base import LLtPIT


class QrNoSignFixPIT(LLtPIT):
    @torch.no_grad()
    def post_step(self):
        q, _ = torch.linalg.qr(self.Z)
        self.Z.copy_(q)


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return QrNoSignFixPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
