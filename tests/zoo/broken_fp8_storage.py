"""Broken: asked for float32, it computes with a float8 (E4M3, one fp32 scale) copy of Z, refreshed after each
step from the fp32 master (an FSDP2-style float8 weight taken one step too far: the copy is what the maps
use, gradients reach the master straight through). ||Z^T Z - I|| sits at E4M3's floor (~1e-1). Caught by
`contract` (buffer Z8 is stored in float8_e4m3fn); penrose and reference fail it as well."""
import torch

from ._base import LLtPIT, qr_sign

E4M3_MAX = 448.0


class Fp8StoragePIT(LLtPIT):
    def __init__(self, vocab_size, hidden_size, *, dtype, device, seed):
        super().__init__(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
        self.register_buffer("Z8", torch.zeros(vocab_size, hidden_size, device=device).to(torch.float8_e4m3fn))
        self.register_buffer("scale", torch.ones((), device=device))
        self.refresh()

    @torch.no_grad()
    def refresh(self):
        Z = self.Z.detach().float()
        self.scale.copy_(Z.abs().max().clamp_min(1e-30) / E4M3_MAX)
        self.Z8.copy_((Z / self.scale).to(torch.float8_e4m3fn))

    def memory(self):
        stored = (self.Z8.float() * self.scale).to(self.master)
        return stored + (self.Z - self.Z.detach())  # the master gets the gradient

    @torch.no_grad()
    def post_step(self):
        self.Z.copy_(qr_sign(self.Z))
        self.refresh()


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return Fp8StoragePIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
