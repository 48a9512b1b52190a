"""`pitcheck convert`: a tied table (any --teacher spec) to its PIT form in one conversion mode, written with
its certificate."""
from __future__ import annotations

from pathlib import Path

from ...infra.errors import PitcheckError
from ...infra.progress import Progress
from ...infra.rundir import check_out_path
from ...sources.pretrained.certificate import CERTIFIED_DTYPES, certify
from ...sources.pretrained.conversion import DEFAULT_MODE, convert_table, get_mode, in_mode, write_conversion
from ...trajectory.teacher import SMOLLM2, load_teacher


def convert(teacher: str, out: Path | str, dtypes=CERTIFIED_DTYPES, out_dtype: str = "float32",
            progress: bool | None = None, mode: str = DEFAULT_MODE, scale: float | None = None) -> dict:
    """Convert the teacher's table in `mode` (pitcheck.sources.pretrained.conversion.MODES), certify it in each
    dtype, write OUT/converted.safetensors (Z, L in out_dtype; a scaled mode's s too) and OUT/certificate.json.
    keep-embedding-scaled takes `scale`, or fits it on SmolLM2's held-out text when the teacher is smollm2.
    Returns the certificate and the paths written."""
    spec = get_mode(mode)
    fit = spec.scaled and scale is None
    if fit and teacher != SMOLLM2:
        raise PitcheckError(f"mode {mode} fits its logit scale with the teacher's model on held-out text, which "
                            f"only the smollm2 teacher has here: pass --scale S for {teacher}")
    out = check_out_path(out)
    bar = Progress(2 + int(fit) + len(dtypes), f"convert {teacher} ({mode})", progress)
    E0 = load_teacher(teacher)
    bar.advance("read")
    fitted = None
    if fit:
        from .calibrate import fit_scale

        unscaled = convert_table(E0)
        fitted = fit_scale(unscaled)
        scale = fitted["scale"]
        bar.advance(f"logit scale {scale:.4g}")
        conv = in_mode(unscaled, mode, scale)
    else:
        conv = convert_table(E0, mode, scale)
    bar.advance("converted")
    cert = certify(E0, conv, dtypes, source=teacher, progress=lambda d: bar.advance(f"certifying {d}"))
    if fitted is not None:
        cert["scale_fit"] = {**fitted, "text": "SmolLM2 held-out calibration windows (none an evaluation window)"}
    cert["written_dtype"] = out_dtype
    return {"certificate": cert, "paths": write_conversion(out, conv, cert, out_dtype)}
