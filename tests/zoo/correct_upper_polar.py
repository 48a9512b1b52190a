"""Correct, other convention: T = R^T R with R upper triangular (softplus diagonal with a floor);
embed solves R^T y = z then R e = y; logits = (h R^T) R Z^T. Z retracted to its polar factor U V^T
(thin SVD) in post_step. fp32 masters and fp32 factor work under half precision."""
import torch
import torch.nn.functional as F


class UpperPolarPIT(torch.nn.Module):
    FLOOR = 1e-5

    def __init__(self, vocab_size, hidden_size, *, dtype, device, seed):
        super().__init__()
        self.V, self.D, self.dtype = vocab_size, hidden_size, dtype
        self.pdtype = dtype if dtype in (torch.float32, torch.float64) else torch.float32
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(vocab_size, hidden_size, generator=gen, dtype=torch.float64)
        u, _, vt = torch.linalg.svd(x, full_matrices=False)  # polar factor of a Gaussian: Haar, orthonormal
        self.Z = torch.nn.Parameter((u @ vt).to(device=device, dtype=self.pdtype))
        d0 = torch.log(torch.expm1(torch.tensor(1.0 - self.FLOOR, dtype=torch.float64)))
        self.R_raw = torch.nn.Parameter(torch.eye(hidden_size, dtype=torch.float64).mul(d0).to(device, self.pdtype))

    def R(self):
        return torch.triu(self.R_raw, 1) + torch.diag(F.softplus(torch.diag(self.R_raw)) + self.FLOOR)

    def _mem(self):
        if self.dtype != self.pdtype:
            return self.Z.to(self.dtype).to(self.pdtype)
        return self.Z

    def embed(self, ids):
        ids = torch.as_tensor(ids)
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(f"token ids must have an integer dtype, not {ids.dtype}")
        if ids.numel() > 0:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= self.V:
                raise IndexError(f"token ids must be in [0, {self.V}), got min {lo} max {hi}")
        R = self.R()
        z = self._mem()[ids.reshape(-1).to(self.Z.device)]  # B x D rows
        # rows: e = z T^{-1} = z R^{-1} R^{-T}; solve from the left on z^T
        y = torch.linalg.solve_triangular(R.T, z.T, upper=False)
        e = torch.linalg.solve_triangular(R, y, upper=True).T
        return e.reshape(*ids.shape, self.D).to(self.dtype)

    def logits(self, h):
        R = self.R()
        return ((h.to(self.pdtype) @ R.T) @ R @ self._mem().T).to(self.dtype)

    @torch.no_grad()
    def post_step(self):
        u, _, vt = torch.linalg.svd(self.Z, full_matrices=False)
        self.Z.copy_(u @ vt)


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return UpperPolarPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
