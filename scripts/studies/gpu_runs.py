"""`pitcheck run` on a CUDA device in each precision, beside the same run on the CPU: where the interface ends.

    python scripts/studies/gpu_runs.py [--vocab 8192 --dim 128 --steps 1000] [--cpu-steps 200] [--out results/gpu/runs.json]

Each run is the Python API's `run` (what `pitcheck run` calls) with the torch backend and its float64
shadow on the same gradient stream. For every precision it writes the device the manifest names, what was
emulated (nothing, on CUDA, for the native formats), the wall time and the last recorded row's metrics:
orthonormality, the pseudo-inverse drift ||W E - I||_F, and the distance to the float64 shadow, each also
in units of u of the precision's storage. A CPU run of the same config (fewer steps, the CPU is slower)
gives the figures a CUDA run should agree with in order of magnitude, not in digits: the devices' GEMMs
sum in different orders.
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pitcheck.infra.errors import PitcheckError  # noqa: E402
from pitcheck.numerics.policy import get_policy  # noqa: E402
from pitcheck.trajectory import RunConfig, run  # noqa: E402

KEYS = ("step", "orthonormality", "orthonormality_ratio", "pinv_drift", "penrose", "shadow_Z", "shadow_T", "cond_T")


def one(precision, device, args, steps):
    config = RunConfig(backend="torch", precision=precision, retraction=args.retraction, vocab=args.vocab,
                       dim=args.dim, steps=steps, device=device, optimizer="adam", lr=1e-2, seed=0)
    with tempfile.TemporaryDirectory() as scratch:
        t0 = time.perf_counter()
        rows = run(config, Path(scratch) / "run", progress=False)
        seconds = time.perf_counter() - t0
        manifest = json.loads((Path(scratch) / "run" / "manifest.json").read_text())
    last = rows[-1]
    u = get_policy(precision).u
    out = {"precision": precision, "device": manifest["device"], "emulated": manifest.get("emulated"),
           "steps": steps, "seconds": round(seconds, 3), "u": u}
    out.update({k: last.get(k) for k in KEYS})
    for k in ("orthonormality", "pinv_drift", "shadow_Z"):
        if isinstance(last.get(k), float):
            out[k + "_over_u"] = last[k] / u
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precisions", default="fp32,tf32,bf16,bf16-mixed,fp16-mixed,fp8-store,fp8-logits")
    ap.add_argument("--retraction", default="qr")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--cpu-steps", type=int, default=0, help="also run each precision this many steps on the CPU")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows = []
    devices = (["cuda"] if torch.cuda.is_available() else []) + (["cpu"] if args.cpu_steps else [])
    for precision in args.precisions.split(","):
        for device in devices:
            steps = args.steps if device == "cuda" else args.cpu_steps
            try:
                row = one(precision, device, args, steps)
            except PitcheckError as exc:
                if "interrupted" in str(exc):  # a time limit's SIGTERM: the run saved its checkpoint; stop here
                    raise SystemExit(f"stopped at {precision} on {device}: {exc}") from None
                row = {"precision": precision, "device": device, "error": f"{exc}"[:300]}
            except Exception as exc:  # noqa: BLE001 (a precision that fails on a device is a finding)
                row = {"precision": precision, "device": device, "error": f"{type(exc).__name__}: {exc}"[:300]}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:  # after every run: a time limit that stops the script keeps what was measured
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps({"torch": torch.__version__, "vocab": args.vocab,
                                                      "dim": args.dim, "retraction": args.retraction,
                                                      "runs": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
