"""Correct, the polar convention with no memory of its own: the embedding E (V x D) is the parameter, drawn
as float32 Gaussians (torch's default dtype) and cast up, and the head is its pseudo-inverse
W = (E^T E)^{-1} E^T through a Cholesky factor of the D x D Gram. E = Z T^{-1} with Z, T its polar factors
(T = (E^T E)^{-1/2}), so any full-rank E is a PIT pair and no post_step is needed. Under a float64 request
every entry of E is an exact float32 value at initialisation; `contract` must judge the computed head and
the moved state instead. fp32 master and fp32 factor work under half precision."""
import torch


class FreeEmbeddingPIT(torch.nn.Module):
    def __init__(self, vocab_size, hidden_size, *, dtype, device, seed):
        super().__init__()
        self.V, self.D, self.dtype = vocab_size, hidden_size, dtype
        self.work = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
        gen = torch.Generator().manual_seed(seed)
        draws = torch.randn(vocab_size, hidden_size, generator=gen)  # float32
        self.E = torch.nn.Parameter(draws.to(device=device, dtype=self.work))

    def _used(self):
        return self.E.to(self.dtype).to(self.work) if self.dtype != self.work else self.E

    def embed(self, ids):
        ids = torch.as_tensor(ids, device=self.E.device)
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(f"token ids must be integers, got {ids.dtype}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.V):
            raise IndexError(f"token id out of range [0, {self.V})")
        return self._used()[ids.reshape(-1)].reshape(*ids.shape, self.D).to(self.dtype)

    def logits(self, h):
        E = self._used()
        L = torch.linalg.cholesky(E.T @ E)
        # h (E^T E)^{-1} E^T, with h as rows: solve (E^T E) x = h^T, then x^T E^T
        x = torch.cholesky_solve(h.to(self.work).reshape(-1, self.D).T, L)
        return (x.T @ E.T).reshape(*h.shape[:-1], self.V).to(self.dtype)


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return FreeEmbeddingPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
