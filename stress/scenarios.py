"""Drift stress scenarios: a named run and what must hold over it.

Each scenario is a RunConfig and a check on its metric rows and events; `check` returns a list of
failure messages (empty when the scenario holds). test_scenarios.py runs them all; users can import
stress.scenarios.SCENARIOS and run any of them against their own settings.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pitcheck.trajectory import RunConfig


@dataclass(frozen=True)
class Scenario:
    name: str
    config: RunConfig
    check: Callable[[list[dict], list[dict]], list[str]]
    why: str


def _max_orth_below(limit):
    def check(rows, events):
        worst = max(r["orthonormality"] for r in rows)
        return [] if worst < limit else [f"max orthonormality {worst:.3e} >= {limit:g}"]
    return check


def _final_orth_above(limit):
    def check(rows, events):
        last = rows[-1]["orthonormality"]
        return [] if last > limit else [f"final orthonormality {last:.3e} <= {limit:g}"]
    return check


# Growth is judged from step 1, the first retraction output: step 0 is the float64 start rounded to
# the storage format, below the level any retraction in that format lands at.
def _after_first_step(rows):
    return [r for r in rows if r["step"] >= 1]


def _flat(factor, ratio_limit=30.0):
    def check(rows, events):
        rows = _after_first_step(rows)
        vals = [r["orthonormality"] for r in rows]
        out = []
        if max(vals) > factor * vals[0]:
            out.append(f"orthonormality rose from {vals[0]:.3e} to {max(vals):.3e} (> {factor}x)")
        worst_ratio = max(r["orthonormality_ratio"] for r in rows)
        if worst_ratio > ratio_limit:
            out.append(f"orthonormality ratio {worst_ratio:.1f} > {ratio_limit:g} (LAPACK's dqrt01 level)")
        return out
    return check


def _grows(factor, metric="orthonormality"):
    def check(rows, events):
        rows = _after_first_step(rows)
        first, last = rows[0][metric], rows[-1][metric]
        return [] if last > factor * first else [f"{metric} grew only {last / first:.2f}x (< {factor}x)"]
    return check


def _floor(low, high):
    def check(rows, events):
        v = rows[0]["orthonormality"]
        return [] if low < v < high else [f"step-0 orthonormality {v:.3e} outside ({low:g}, {high:g})"]
    return check


def _unresolved_recorded(rows, events):
    if any(e["event"] == "precision_cannot_resolve" for e in events):
        return []
    return ["conditioning attack never pushed cond(T) u past 0.1, or the event was not recorded"]


FP64 = dict(backend="numpy", precision="fp64", vocab=1024, dim=32)
FP32 = dict(backend="torch", precision="fp32", vocab=2048, dim=64, device="cpu", shadow=False)

SCENARIOS = [
    *[
        Scenario(f"fp64-{r}-stays-on-manifold", RunConfig(**FP64, retraction=r, steps=1000), _max_orth_below(1e-12),
                 "a projective or exact-Cayley retraction in float64 keeps ||Z^T Z - I|| at rounding level")
        for r in ("qr", "polar", "cayley")
    ],
    Scenario("fp64-none-drifts", RunConfig(**FP64, retraction="none", steps=300), _final_orth_above(1e-6),
             "without a retraction Z leaves the manifold at second order in the step"),
    Scenario("fp32-qr-flat", RunConfig(**FP32, retraction="qr", steps=1500), _flat(3.0),
             "QR re-orthonormalises from scratch each step: fp32 error stays flat"),
    Scenario("fp32-cayley-accumulates", RunConfig(**FP32, retraction="cayley", steps=1500), _grows(3.0),
             "Cayley never corrects earlier rounding error: fp32 error accumulates"),
    Scenario("fp32-qr-wanders-from-fp64",
             RunConfig(**{**FP32, "vocab": 512, "dim": 16, "shadow": True}, retraction="qr", steps=1000),
             _grows(30.0, "shadow_Z"),
             "QR is not idempotent in floating point: each call moves Z by O(u), on the manifold but off the "
             "exact trajectory, and the moves accumulate"),
    Scenario("bf16-storage-floor", RunConfig(**{**FP32, "precision": "bf16"}, steps=0), _floor(1e-3, 1e-2),
             "a bf16 memory cannot be more orthonormal than its rounding allows, from step 0"),
    Scenario("fp32-cayley-threshold-guard",
             RunConfig(**{**FP32, "vocab": 512, "dim": 32}, retraction="cayley", steps=500, reproject_threshold=2e-5,
                       adversary="dense_output,heavy_tail,spike"),
             _max_orth_below(4e-5), "a threshold re-projection bounds Cayley's drift under heavy-tailed gradients"),
    Scenario("bf16-conditioning-attack-unresolved",
             RunConfig(**{**FP32, "precision": "bf16", "vocab": 256, "dim": 16}, adversary="conditioning", lr=0.05,
                       steps=300),
             _unresolved_recorded, "once cond(T) u > 0.1 the solve error is beyond bf16: recorded, not judged"),
]
