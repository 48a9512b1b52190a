"""Where each exact retraction lands on CUDA against where it lands on the CPU, from the same float32 point.

    python scripts/measurements/device_accuracy.py [--shape 32768x512] [--out FILE.json]

One tangent step from an orthonormal Z (the point gpu_bench.py times), every exact map applied by
pitcheck's TorchOps on the CPU and, where torch sees one, on CUDA; ||Z'^T Z' - I||_F in units of u = 2^-24,
computed in float64. The target: each map on CUDA within 2x of its CPU distance. Without a GPU it prints the
CPU column only, which keeps the script tested between GPU sessions.
"""
import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pitcheck.model.retractions import APPROXIMATE, RETRACTIONS  # noqa: E402
from pitcheck.numerics.arrays import TorchOps  # noqa: E402

U32 = 2.0 ** -24
WITHIN = 2.0  # the target: a map's CUDA distance at most this times its CPU distance


def tangent_point(V: int, D: int, seed: int = 0):
    """Orthonormal Z and a tangent step of norm 1e-2 sqrt(D), in float64 on the CPU."""
    g = torch.Generator().manual_seed(seed)
    Z, _ = torch.linalg.qr(torch.randn(V, D, generator=g, dtype=torch.float64))
    G = torch.randn(V, D, generator=g, dtype=torch.float64)
    xi = G - Z @ ((Z.T @ G + G.T @ Z) / 2)
    return Z, xi * (1e-2 * math.sqrt(D) / torch.linalg.norm(xi))


def distance_over_u(name: str, Z, xi, device: str) -> float:
    Zd, xid = (a.to(device=device, dtype=torch.float32) for a in (Z, xi))
    out = RETRACTIONS[name](Zd, xid, TorchOps()).double()
    D = out.shape[1]
    return float(torch.linalg.norm(out.T @ out - torch.eye(D, dtype=torch.float64, device=out.device))) / U32


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="32768x512", help="VxD (default 32768x512)")
    ap.add_argument("--retractions", default=None, help="comma-separated (default: every exact map)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    V, D = (int(n) for n in args.shape.lower().split("x"))
    names = (args.retractions.split(",") if args.retractions else
             [n for n in RETRACTIONS if n != "none" and n not in APPROXIMATE])
    Z, xi = tangent_point(V, D)
    gpu = torch.cuda.is_available()
    rows = []
    print(f"{V} x {D} fp32, one tangent step: ||Z'^T Z' - I||_F / u" + ("" if gpu else " (no CUDA device: CPU only)"))
    print(f"{'map':18s} {'cpu':>10s} {'cuda':>10s} {'cuda/cpu':>9s}")
    for name in names:
        row = {"retraction": name, "vocab": V, "dim": D, "cpu": distance_over_u(name, Z, xi, "cpu")}
        if gpu:
            row["cuda"] = distance_over_u(name, Z, xi, "cuda")
            row["ratio"] = row["cuda"] / row["cpu"]
            row["within_target"] = row["ratio"] <= WITHIN
        rows.append(row)
        print(f"{name:18s} {row['cpu']:10.3g} {row.get('cuda', float('nan')):10.3g} {row.get('ratio', float('nan')):9.3g}")
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name() if gpu else None,
                                        "torch": torch.__version__, "within": WITHIN, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
