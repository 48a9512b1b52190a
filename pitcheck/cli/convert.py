"""`pitcheck convert`: a pretrained tied table to PIT's Z and L (safetensors) with its certificate (JSON)."""
from __future__ import annotations

import argparse

NEEDS_TORCH = True


def add_parser(sub) -> argparse.ArgumentParser:
    c = sub.add_parser("convert", help="convert a tied embedding to its exact PIT form (Z = P Q^T, "
                       "T = Q S^-1 Q^T) and certify it: converted.safetensors, certificate.json")
    c.add_argument("teacher", help="smollm2, FILE.gguf:TENSOR, FILE.safetensors:TENSOR or FILE.npy")
    c.add_argument("--out", required=True, help="directory for converted.safetensors and certificate.json")
    c.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="dtype Z and L are written in")
    c.add_argument("--certify", default="float64,float32,bfloat16",
                   help="precisions the certificate measures the module in (comma-separated)")
    return c


def _row(name: str, m: dict) -> str:
    return (f"{name:9s} |E-E0|/|E0| {m['relative_error']:.3g} ({m['relative_error_u']:.3g} u; bound "
            f"{m['bound']:.3g}: {m['verdict']})  |WE-I| {m['pinv_drift']:.3g} ({m['pinv_drift_u']:.3g} u)  "
            f"penrose max {max(m[f'penrose_{i}'] for i in range(1, 5)):.3g}  |Z^TZ-I| {m['orthonormality']:.3g} "
            f"({m['orthonormality_u']:.3g} u)")


def main(args) -> int:
    from ..verbs.convert import convert

    dtypes = tuple(d.strip() for d in args.certify.split(",") if d.strip())
    result = convert(args.teacher, args.out, dtypes, args.dtype)
    cert = result["certificate"]
    print(f"{args.teacher}: {cert['vocab']} x {cert['dim']}, cond(E0) {cert['cond_E0']:.4g}")
    for name, m in cert["precisions"].items():
        print(_row(name, m))
    for path in result["paths"].values():
        print(f"wrote {path}")
    failed = [name for name, m in cert["precisions"].items() if m["verdict"] == "fail"]
    return 1 if failed else 0
