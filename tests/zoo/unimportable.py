"""Broken: imports a module that does not exist, so the target fails at import time. The validator must
end with exit 2 and a one-line reason."""
import pitcheck_fused_kernels_that_do_not_exist  # noqa: F401


def make(vocab_size, hidden_size, *, dtype, device, seed):
    raise AssertionError("unreachable")
