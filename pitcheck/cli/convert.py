"""`pitcheck convert`: a pretrained tied table to PIT's Z and L (safetensors) with its certificate (JSON)."""
from __future__ import annotations

import argparse

NEEDS_TORCH = True


def add_parser(sub) -> argparse.ArgumentParser:
    c = sub.add_parser("convert", help="convert a tied embedding E0 = Z H (polar) to PIT's form in a mode (T = H^-1 "
                       "keeps E = E0, T = H keeps W = E0^T, ...) and certify it: converted.safetensors, certificate.json")
    c.add_argument("teacher", help="smollm2, FILE.gguf:TENSOR, FILE.safetensors:TENSOR or FILE.npy")
    c.add_argument("--out", required=True, help="directory for converted.safetensors and certificate.json")
    c.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="dtype Z and L are written in")
    c.add_argument("--certify", default="float64,float32,bfloat16",
                   help="precisions the certificate measures the module in (comma-separated)")
    c.add_argument("--mode", default="keep-embedding",
                   choices=["keep-embedding", "keep-head", "balanced", "keep-embedding-scaled", "sqrt"],
                   help="what the conversion keeps: keep-embedding (T = H^-1, E = E0; the default), keep-head "
                        "(T = H, W = E0^T), balanced (T = I, E = Z), keep-embedding-scaled (keep-embedding plus a "
                        "logit scale s fitted on held-out text, outside PIT: W E = s I), sqrt (T = H^1/2)")
    c.add_argument("--scale", type=float, default=None,
                   help="keep-embedding-scaled's logit scale s (default: fitted on SmolLM2's held-out text)")
    return c


def _figure(name: str, f: dict) -> str:
    judged = f"bound {f['bound']:.3g}: {f['verdict']}" if "bound" in f else "measured"
    return f"{name} {f['error']:.3g} ({f['error_u']:.3g} u; {judged})"


def _row(name: str, m: dict) -> str:
    return (f"{name:9s} {_figure('|E-E0|/|E0|', m['embedding'])}  {_figure('|W-E0^T|/|E0|', m['head'])}  "
            f"{_figure('|WE-sI|/s', m['inverse'])}  penrose max {max(m[f'penrose_{i}'] for i in range(1, 5)):.3g}  "
            f"|Z^TZ-I| {m['orthonormality']:.3g} ({m['orthonormality_u']:.3g} u)  cond(T) {m['cond_T']:.4g}")


def main(args) -> int:
    from ..verbs.convert import convert

    dtypes = tuple(d.strip() for d in args.certify.split(",") if d.strip())
    result = convert(args.teacher, args.out, dtypes, args.dtype, mode=args.mode, scale=args.scale)
    cert = result["certificate"]
    scale = f", logit scale s {cert['scale']:.6g}" if cert["mode"] == "keep-embedding-scaled" else ""
    print(f"{args.teacher}: {cert['vocab']} x {cert['dim']}, cond(E0) {cert['cond_E0']:.4g}, mode {cert['mode']} "
          f"({cert['algebra']}){scale}")
    for name, m in cert["precisions"].items():
        print(_row(name, m))
    for path in result["paths"].values():
        print(f"wrote {path}")
    failed = [name for name, m in cert["precisions"].items() if m["verdict"] == "fail"]
    return 1 if failed else 0
