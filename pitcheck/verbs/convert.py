"""`pitcheck convert`: a tied table (any --teacher spec) to its exact PIT form, written with its certificate."""
from __future__ import annotations

from pathlib import Path

from ..infra.progress import Progress
from ..infra.rundir import check_out_path
from ..trajectory.teacher import load_teacher
from ..sources.pretrained.conversion import CERTIFIED_DTYPES, certify, convert_table, write_conversion


def convert(teacher: str, out: Path | str, dtypes=CERTIFIED_DTYPES, out_dtype: str = "float32",
            progress: bool | None = None) -> dict:
    """Convert the teacher's table, certify it in each dtype, write OUT/converted.safetensors (Z, L in
    out_dtype) and OUT/certificate.json. Returns the certificate and the paths written."""
    out = check_out_path(out)
    bar = Progress(2 + len(dtypes), f"convert {teacher}", progress)
    E0 = load_teacher(teacher)
    bar.advance("read")
    conv = convert_table(E0)
    bar.advance("converted")
    cert = certify(E0, conv, dtypes, source=teacher, progress=lambda d: bar.advance(f"certifying {d}"))
    cert["written_dtype"] = out_dtype
    return {"certificate": cert, "paths": write_conversion(out, conv, cert, out_dtype)}
