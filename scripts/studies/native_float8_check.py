"""Native float8 against the emulation on this machine's device (CUDA when present, else CPU).

    python scripts/studies/native_float8_check.py [--device cuda] [--out results/gpu/native_float8.json]

Counts, for each element format, the float32 probe inputs (every value, midpoint and its neighbours,
overflow, infinities, NaN, random values) whose native cast differs from pitcheck.numerics.formats.round_to; for
each recipe the scaled operands that differ from the emulation; and for each recipe pair the GEMM's
largest error over its fp32-accumulation bound (<= 1 expected) and its time against an fp32 GEMM of the
same shape, measured in the same run.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pitcheck.numerics.formats import FORMATS, round_to  # noqa: E402
from pitcheck.numerics.native_float8 import cast, gemm_error_bound, quantise, scaled_mm  # noqa: E402
from pitcheck.numerics.scaling import fake_quant  # noqa: E402


def probes(element, device):
    bits = torch.arange(256, dtype=torch.uint8).view(getattr(torch, FORMATS[element].torch_name)).float()
    v = torch.unique(bits[torch.isfinite(bits)]).double()
    mid = ((v[1:] + v[:-1]) / 2).float()
    g = torch.Generator().manual_seed(0)
    rnd = (torch.rand(100000, generator=g) * 2 - 1) * torch.exp2(torch.randint(-24, 18, (100000,), generator=g))
    x = torch.cat([v.float(), mid, torch.nextafter(mid, torch.tensor(np.inf)), torch.nextafter(mid, torch.tensor(-np.inf)),
                   torch.tensor([np.inf, -np.inf, np.nan, 1e30]), rnd.float()])
    return torch.cat([x, -x]).to(device)


def timed(fn, repeats=20):
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", default="4096x576x8192", help="M x K x N of the timed GEMM")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    dev = torch.device(args.device)
    report = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
              "torch": torch.__version__, "casts": {}, "operands": {}, "gemm": {}}
    for element in ("fp8-e4m3", "fp8-e5m2"):
        x = probes(element, dev)
        native = cast(x, element).double().cpu().numpy()
        emulated = round_to(x.double().cpu().numpy(), FORMATS[element], saturate=True)
        same = (native == emulated) | (np.isnan(native) & np.isnan(emulated))
        report["casts"][element] = {"inputs": int(x.numel()), "differ": int((~same).sum())}
    g = torch.Generator().manual_seed(1)
    a = (torch.randn(512, 576, generator=g) * torch.exp2(torch.randint(-6, 6, (512, 1), generator=g).float())).to(dev)
    for recipe in ("tensor-current", "tensor-current-pow2", "block-1x128", "mxfp8", "mxfp8-rceil"):
        values, scales, length, per_row = quantise(a, recipe)
        divisor = scales.double().repeat_interleave(length, dim=1)[:, :576] if per_row else scales.double()
        differ = (values.double() * divisor).cpu() != fake_quant(a.cpu(), recipe)
        report["operands"][recipe] = {"elements": int(a.numel()), "differ": int(differ.sum())}
    M, K, N = (int(s) for s in args.shape.split("x"))
    A = torch.randn(M, K, generator=g).to(dev)
    W = torch.randn(N, K, generator=g).to(dev)
    t32 = timed(lambda: A @ W.T)
    for pair in (("tensor-current", "tensor-current"), ("block-1x128", "block-128x128"), ("mxfp8", "mxfp8")):
        small_a, small_w = A[:256], W[:256]
        out = scaled_mm(small_a, small_w, *pair).double().cpu().numpy()
        parts = []
        for x, recipe in ((small_a, pair[0]), (small_w, pair[1])):
            values, scales, length, per_row = quantise(x, recipe)
            divisor = scales.double().repeat_interleave(length, dim=1)[:, :K] if per_row else scales.double()
            parts.append((values.double() * divisor).cpu().numpy())
        block = min(quantise(small_a, pair[0])[2], quantise(small_w, pair[1])[2])
        bound = gemm_error_bound(parts[0], parts[1], block)
        ratio = float(np.max(np.abs(out - parts[0] @ parts[1].T) / np.maximum(bound, 1e-300)))
        t8 = timed(lambda: scaled_mm(A, W, *pair), repeats=3)
        report["gemm"]["/".join(pair)] = {"error_over_bound": ratio, "seconds": t8, "over_fp32_gemm": t8 / t32}
    report["fp32_gemm_seconds"] = t32
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
