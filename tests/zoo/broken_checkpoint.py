"""Broken: Z is kept as a plain tensor attribute (requires_grad, added to the optimizer by
configure_optimizer so that weight decay skips it), not a Parameter or buffer, and drawn from the global
RNG rather than the seed. state_dict() therefore holds only L; a fresh instance that loads it keeps its
own, different Z, so the maps after a resume and one step differ from the uninterrupted run. The maps
are correct otherwise. Caught by `checkpoint`."""
import torch

from ._base import LLtPIT, qr_sign


class LostMemoryPIT(LLtPIT):
    def __init__(self, vocab_size, hidden_size, *, dtype, device, seed):
        super().__init__(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
        del self.Z
        z = qr_sign(torch.randn(vocab_size, hidden_size, dtype=torch.float64))  # global RNG: seed ignored
        self.Z = z.to(device, self.master).requires_grad_()

    def configure_optimizer(self, params):
        return torch.optim.SGD([{"params": list(params)}, {"params": [self.Z], "weight_decay": 0.0}], lr=1e-2)

    @torch.no_grad()
    def post_step(self):
        self.Z.copy_(qr_sign(self.Z))


def make(vocab_size, hidden_size, *, dtype, device, seed):
    return LostMemoryPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
