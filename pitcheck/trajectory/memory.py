"""Refusing a V x D that cannot fit, before anything of that size is allocated."""
from __future__ import annotations

import os

from ..infra.errors import PitcheckError

# how many float64 V x D arrays a run holds at once, at most: master and stored state, optimizer moments,
# gradients, the embedding, the shadow's copies, the metrics' temporaries and the checkpoint being written
VD_ARRAYS = 32



def available_memory() -> int | None:
    """Bytes of memory available to new allocations (Linux's MemAvailable); None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(vocab: int, dim: int, what: str = "a run") -> None:
    """Refuse a V x D that cannot fit, before anything of that size is allocated."""
    need = vocab * dim * 8 * VD_ARRAYS
    have = available_memory()
    if have is not None and need > have:
        raise PitcheckError(f"V x D = {vocab} x {dim} is too large: {what} needs about {need / 2**30:.3g} GiB "
                            f"({VD_ARRAYS} float64 V x D arrays), and {have / 2**30:.3g} GiB of memory is available")
