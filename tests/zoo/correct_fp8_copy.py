"""Correct, with an E4M3 copy of its memory kept beside it, as FP8 recipes keep for linear layers (a cast
cache refreshed after each step, for a float8 GEMM elsewhere in the model). The maps compute with the
full-precision Z; the copy has Z's shape and is never read here."""
import torch

from ._base import LLtPIT, qr_sign


class Fp8CopyPIT(LLtPIT):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("z_e4m3", self.Z.detach().to(torch.float8_e4m3fn))

    @torch.no_grad()
    def post_step(self):
        self.Z.copy_(qr_sign(self.Z))
        self.z_e4m3.copy_(self.Z.to(torch.float8_e4m3fn))


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return Fp8CopyPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
