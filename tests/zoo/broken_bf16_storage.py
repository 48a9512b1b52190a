"""Broken: asked for float32, it stores Z as a bfloat16 Parameter (to halve the memory of a large
vocabulary) and upcasts it for the compute. Outputs are float32 but ||Z^T Z - I|| sits at the bf16
storage floor (~1e-2), far above fp32's. Caught by `contract` (and `penrose`/`reference` at fp32 budgets)."""
import torch

from ._base import LLtPIT, qr_sign


class Bf16StoragePIT(LLtPIT):
    def __init__(self, vocab_size, hidden_size, *, dtype, device, seed):
        super().__init__(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
        self.Z = torch.nn.Parameter(self.Z.detach().to(torch.bfloat16))

    def memory(self):
        return self.Z.to(self.master)

    @torch.no_grad()
    def post_step(self):
        self.Z.copy_(qr_sign(self.Z.float()).to(torch.bfloat16))


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return Bf16StoragePIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
