"""The reference PIT module (pitcheck.nn.PIT) started from a converted table instead of a random Z.

`make_smollm2` has the factory signature `pitcheck validate` calls: it builds the module from the converted
Z and L named by $PITCHECK_CONVERTED (a `pitcheck convert --mode M` output, the .safetensors file) or, without
it, from SmolLM2's table converted in this process in the mode $PITCHECK_CONVERT_MODE (default keep-embedding).
A scaled mode's logit scale is outside PIT's module: its reference module is its unscaled Z and L.
"""
from __future__ import annotations

import functools
import os

import numpy as np
import torch

from ...model.nn import PIT
from .pit_module import pit_from

CONVERTED_ENV = "PITCHECK_CONVERTED"
MODE_ENV = "PITCHECK_CONVERT_MODE"


@functools.lru_cache(maxsize=1)
def converted_smollm2() -> tuple[np.ndarray, np.ndarray]:
    """(Z, L) of SmolLM2's table: read from $PITCHECK_CONVERTED if set, else converted here (seconds) in the
    mode $PITCHECK_CONVERT_MODE."""
    from .conversion import DEFAULT_MODE, convert_table, get_mode, read_converted
    from .gguf_tables import SMOLLM2_TABLE, read_gguf_table, smollm2_gguf

    path = os.environ.get(CONVERTED_ENV)
    if path:
        return read_converted(path)
    mode = os.environ.get(MODE_ENV) or DEFAULT_MODE
    if get_mode(mode).scaled:  # the same Z and L as its unscaled mode; the scale is not the module's
        mode = DEFAULT_MODE
    conv = convert_table(read_gguf_table(smollm2_gguf(), SMOLLM2_TABLE), mode)
    return conv.Z, conv.L


def make_smollm2(vocab_size: int, hidden_size: int, *, dtype=torch.float32, device="cpu", seed: int = 0,
                 retraction: str = "qr", min_diag: float = 1e-6) -> PIT:
    """Factory for `pitcheck validate`: the reference module from SmolLM2's converted table (seed unused:
    the start is the conversion, not a draw)."""
    Z, L = converted_smollm2()
    if (vocab_size, hidden_size) != Z.shape:
        raise ValueError(f"the converted table is {Z.shape[0]} x {Z.shape[1]}; validate it with "
                         f"--vocab {Z.shape[0]} --dim {Z.shape[1]}, not {vocab_size} x {hidden_size}")
    return pit_from(Z, L, dtype=dtype, device=device, retraction=retraction, min_diag=min_diag)
