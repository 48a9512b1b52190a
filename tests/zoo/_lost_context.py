"""A CPU stand-in for a correct module on CUDA whose refusal of an out-of-range id is a device-side assert.

On CUDA such an assert is asynchronous and sticky: embed returns, the error surfaces when its result is
read, and from then on every CUDA call of the process raises it. Here embed of an out-of-range id returns
a tensor that raises the assert's error when anything reads it, and marks this process's "context" lost:
every later call of the module (and of the factory) raises the same error. The factory installs the
matching detection in pitcheck's worker (pitcheck.verbs.validate.device.context_lost), which on the CPU would
otherwise never report a loss. Not a member of the zoo (leading underscore): a test stand-in, used by
tests/verbs/validate/test_validate_cuda_context.py.
"""
import torch

from ._base import LLtPIT

ASSERT = "CUDA error: device-side assert triggered (stand-in)"
LOST = {"after": ""}  # this process's context: lost once any out-of-range id was embedded


class DeviceAssert(RuntimeError):
    pass


class PendingAssert(torch.Tensor):
    """A result whose kernel failed: reading it in any way raises the assert."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise DeviceAssert(ASSERT)


def alive() -> None:
    if LOST["after"]:
        raise DeviceAssert(ASSERT)


class StickyAssertPIT(LLtPIT):
    def embed(self, ids):
        alive()
        ids = torch.as_tensor(ids, device=self.Z.device)
        if not ids.dtype.is_floating_point and ids.numel() and (ids.min() < 0 or ids.max() >= self.V):
            # the kernel was launched: its result comes back, its error when the result is read
            LOST["after"] = f"embed of ids {ids.tolist()}"
            return torch.zeros(*ids.shape, self.D, dtype=self.dtype).as_subclass(PendingAssert)
        return super().embed(ids)

    def logits(self, h):
        alive()
        return super().logits(h)

    def post_step(self):
        alive()
        super().post_step()


def install_detection() -> None:
    """The worker's check of the context sees this process's stand-in loss (and still a real one)."""
    try:
        from pitcheck.verbs.validate import device
    except ImportError:  # a pitcheck without the check: the loss goes unseen, as on CUDA before it
        return
    if getattr(device.context_lost, "stand_in", False):
        return
    real = device.context_lost

    def context_lost(name: str) -> str:
        return ASSERT if LOST["after"] else real(name)

    context_lost.stand_in = True
    device.context_lost = context_lost


def make(vocab_size, hidden_size, *, dtype, device, seed):
    install_detection()
    alive()  # a lost context fails the next build too
    return StickyAssertPIT(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)
