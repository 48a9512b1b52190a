"""Broken: embed goes through a hand-written torch.autograd.Function (to save the autograd graph of two
solves). The forward is exact (e = z T^{-1} by two solves); the backward applies T^{-1} to the incoming
gradient as L^{-1} L^{-T} instead of L^{-T} L^{-1} (a transpose lost in the derivation). Exact at L = I
and for diagonal L, wrong gradients for Z and L at any generic T. Caught by `gradients`."""
import torch

from ._base import LLtPIT


class _TwoSolves(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, L):
        # rows: B x D; e = rows T^{-1}, computed on the transposed right-hand side
        y = torch.linalg.solve_triangular(L, rows.T, upper=False)
        e = torch.linalg.solve_triangular(L.T, y, upper=True).T
        ctx.save_for_backward(L, e)
        return e

    @staticmethod
    def backward(ctx, grad_e):
        L, e = ctx.saved_tensors
        # should be T^{-1} grad = L^{-T} (L^{-1} grad); the bug solves with L^T first
        y = torch.linalg.solve_triangular(L.T, grad_e.T, upper=True)
        g_hat = torch.linalg.solve_triangular(L, y, upper=False).T  # B x D
        grad_T = -g_hat.T @ e  # dloss/dT for e = z T^{-1}
        grad_L = (grad_T + grad_T.T) @ L
        return g_hat, torch.tril(grad_L)


class CustomBackwardPIT(LLtPIT):
    def embed(self, ids):
        ids = self.check_ids(ids)
        rows = self.memory()[ids.reshape(-1)]
        e = _TwoSolves.apply(rows, self.factor())
        return e.reshape(*ids.shape, self.D).to(self.dtype)


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return CustomBackwardPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
