"""Judging: one function per named check, in float64, on the values the target produced (probes.py).

Every verdict rests on a normalised ratio, LAPACK-style: the measured error divided by what a correct
implementation may commit in the dtype under test (u = 2^-p, times cond(T) where perturbation theory puts
it). A ratio above TAU fails. Where the threshold itself, in absolute terms, exceeds RESOLVABLE the dtype
cannot separate a correct implementation from a wrong one, and the verdict is `inconclusive`.

cond(T) is read off the head: W = T Z^T has the eigenvalues of T as singular values when Z is
orthonormal. The memory's orthonormality is read off the maps too: W E = T (Z^T Z) T^{-1} is similar to
Z^T Z, so max |eig(W E) - 1| = ||Z^T Z - I||_2 whatever the convention for T.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...numerics import metrics, reference
from ...numerics.metrics import condition_number
from .dtypes import FP32_U, NARROWER, UNIT_ROUNDOFF, WIDTH, element_bits, unit_roundoff
from .probes import (Probe, probe_bad_input, probe_checkpoint, probe_conditioning, probe_contract, probe_gradients,
                     probe_penrose, probe_reference, probe_retraction, probe_scale, probe_trajectory)
from .registry import CHECK_RECORDS, Check, register

# Correct implementations in five conventions measure ratios of 0.1 to 8 (the zoo of correct modules);
# LAPACK's suites pass below 30. 16 keeps bf16 resolvable at cond(T) <= 1.6 (16 u = 0.0625).
TAU = 16.0
# An absolute threshold above this cannot tell right from wrong
RESOLVABLE = 0.1
VERDICTS = ("pass", "fail", "inconclusive", "error")


@dataclass
class CheckResult:
    name: str
    verdict: str
    value: float | None = None  # the worst normalised ratio measured (None: nothing measurable)
    threshold: float | None = None
    measured: float | None = None  # the raw error behind that ratio
    reason: str = ""
    details: list = field(default_factory=list)  # one row per state or case, for the reports

    def to_json(self) -> dict:
        return {"name": self.name, "verdict": self.verdict, "value": _finite_or_none(self.value),
                "measured": _finite_or_none(self.measured),
                "threshold": self.threshold, "reason": self.reason,
                "details": [{k: (_finite_or_none(v) if isinstance(v, float) else v) for k, v in d.items()}
                            for d in self.details]}


def _finite_or_none(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf" if x < 0 else "nan")


@dataclass(frozen=True)
class Context:
    dtype: str
    u: float
    vocab: int
    dim: int

    def unit(self, cond: float = 1.0) -> float:
        """What a correct implementation may commit: cond(T) times one rounding to the dtype under test
        plus a length-D computation (probabilistic sqrt(D) growth) in fp32 or finer. Half-precision
        targets compute their factor work in fp32 at least: torch has no half-precision solve."""
        return cond * (self.u + math.sqrt(self.dim) * min(self.u, FP32_U))


def generic_condition(ctx: Context) -> float:
    """cond(T) of the generic states: 10, or less where the dtype could not resolve a judgement there."""
    return float(min(10.0, 0.9 * RESOLVABLE / (TAU * ctx.unit(1.0))))


# ---- measurements on a pair of maps ----------------------------------------------------------------

def numerically_full_rank(sv: np.ndarray, shape) -> bool:
    """Singular values (descending) all above numpy.linalg.matrix_rank's float64 tolerance."""
    return bool(sv[-1] > sv[0] * max(shape) * np.finfo(np.float64).eps)


def memory_orthonormality(E: np.ndarray, W: np.ndarray) -> float:
    """||Z^T Z - I||_2 from the maps alone: the eigenvalues of W E are those of Z^T Z."""
    ev = np.linalg.eigvals(W @ E)
    return float(np.max(np.abs(ev - 1.0)))


def interface(E: np.ndarray, W: np.ndarray) -> dict:
    """cond(T), the Penrose residuals, pinv drift and memory orthonormality of one state.

    cond(T) is the smaller of cond(W) and cond(E) (equal for a correct pair), so that a map which lost
    rank (a pinv head truncating a small singular value) cannot excuse its error by its own conditioning."""
    if not (np.isfinite(E).all() and np.isfinite(W).all()):
        return {"finite": False}
    cond = min(condition_number(W), condition_number(E))
    out = {"finite": True, "cond_T": cond, "pinv_drift": metrics.pinv_drift(E, W.T),
           "orthonormality": memory_orthonormality(E, W)}
    pen = metrics.penrose_residuals(E, W.T)
    out["penrose"] = max(pen.values())
    out["worst_condition"] = max(pen, key=pen.get)
    return out


def _states(probe: Probe):
    for state in probe.facts.get("states", []):
        label = state["label"]
        yield state, probe.arrays[f"E:{label}"], probe.arrays[f"W:{label}"]


class Verdicts:
    """Accumulates per-state ratios into one verdict: fail beats inconclusive beats pass."""

    def __init__(self, name: str, ctx: Context):
        self.result = CheckResult(name, "pass", None, TAU)
        self.ctx = ctx
        self.failures: list[str] = []
        self.unresolved: list[str] = []

    def ratio(self, label: str, value: float, scale: float, what: str, precision: str | None = None, **row) -> None:
        """Judge `value` against TAU * scale; scale is what a correct implementation may commit (its unit).
        `precision` names what limits the measurement where that is not the dtype under test."""
        r = value / scale if scale > 0 else math.inf
        row.update({"state": label, "measure": what, "raw": value, "ratio": r, "threshold": TAU})
        if not math.isfinite(scale):
            # an infinite unit is an infinite cond(T): a singular map, not an unresolvable question
            row["verdict"] = "fail"
            self.failures.append(f"{label}: the maps are rank deficient (cond(T) infinite), so {what} is undefined")
        elif TAU * scale > RESOLVABLE:
            row["verdict"] = "inconclusive"
            self.unresolved.append(f"{label}: {precision or self.ctx.dtype} cannot resolve {what} "
                                   f"(threshold {TAU * scale:.2g})")
        elif not r <= TAU:
            row["verdict"] = "fail"
            self.failures.append(f"{label}: {what} {value:.3g} is {r:.3g} x its unit (threshold {TAU:g})")
        else:
            row["verdict"] = "pass"
        if row["verdict"] != "inconclusive" and (self.result.value is None or not r <= self.result.value):
            self.result.value, self.result.measured = r, value
        self.result.details.append(row)

    def fail(self, label: str, reason: str, **row) -> None:
        self.failures.append(f"{label}: {reason}")
        self.result.details.append({"state": label, "verdict": "fail", "reason": reason, **row})

    def inconclusive(self, label: str, reason: str) -> None:
        self.unresolved.append(f"{label}: {reason}")
        self.result.details.append({"state": label, "verdict": "inconclusive", "reason": reason})

    def done(self) -> CheckResult:
        if self.failures:
            self.result.verdict, self.result.reason = "fail", "; ".join(self.failures[:3])
            if self.result.value is not None and self.result.value <= TAU:
                # the failure has no ratio (non-finite maps, a wrong shape): a passing measurement's ratio
                # beside it would read as the failure's size
                self.result.value = self.result.measured = None
        elif self.unresolved:
            self.result.verdict, self.result.reason = "inconclusive", "; ".join(self.unresolved[:2])
        elif not self.result.details:
            self.result.verdict, self.result.reason = "inconclusive", "nothing could be measured"
        return self.result


def judge_pair(v: Verdicts, label: str, E, W, ctx: Context, **row) -> dict | None:
    """The Penrose conditions of one state, and W E = I (relative to ||I||_F), in units of ctx.unit(cond)."""
    m = interface(E, W)
    if not m["finite"]:
        v.fail(label, "the maps contain non-finite values", **row)
        return None
    unit = ctx.unit(m["cond_T"])
    v.ratio(label, m["penrose"], unit, f"penrose residual ({m['worst_condition']})",
            cond_T=m["cond_T"], orthonormality=m["orthonormality"], **row)
    v.ratio(label, m["pinv_drift"] / math.sqrt(ctx.dim), unit, "||W E - I||_F / sqrt(D)", cond_T=m["cond_T"], **row)
    return m


def judge_shadow(v: Verdicts, probe: Probe, label: str, ctx: Context) -> None:
    """A pass in a dtype coarser than float32 certifies errors below TAU units of that dtype (a few percent
    in bfloat16), which can hide a defect of the code itself: a memory that drifts off the manifold or an
    embedding that lags the head by a few optimizer steps measures ~0.01 after the probes' steps at
    V = 128, D = 8 (2.5 bfloat16 units, 3e4 float32 units). The float64 build of the same target, taken
    through the same steps (`E64:`/`W64:` arrays beside the state), has none of that rounding: where its
    Penrose residual, W E - I or ||Z^T Z - I||_2 exceeds TAU units of float32 (the finest precision the
    units assume a half-precision target computes in: Context.unit; of the coarsest dtype the build stores
    a tensor in, where that is coarser, and not consulted at all where it stores the dtype under test or a
    coarser one: broken_bf16_storage's Z under a bfloat16 request), the error is in the code, and the
    dtype under test cannot tell whether it grows past its own threshold. The build starts from the dtype's
    stored values with its stored orthonormal tensors taken back to the manifold (probes.synced_shadow), so
    what it shows is the code's, not the storage rounding's: such a state fails, since the same code is
    what runs in the dtype under test. Where the build had no V x D tensor to take back, it may be carrying
    the storage rounding, and the state is inconclusive, never a pass."""
    if f"E64:{label}" not in probe.arrays or not ctx.u > FP32_U:
        return
    storage = probe.facts.get("shadow_storage", "float64")
    u_build = max(FP32_U, unit_roundoff(storage))
    if not u_build < ctx.u:
        # a float64 build that stores a tensor in the dtype under test (or coarser) rounds as that dtype
        # does: it shows nothing the dtype's own measurement does not
        v.result.details.append({"state": label, "verdict": "pass", "measure": "float64 build",
                                 "reason": f"not consulted: it stores {storage}"})
        return
    E64, W64 = probe.arrays[f"E64:{label}"], probe.arrays[f"W64:{label}"]
    m = interface(E64, W64)
    if not m["finite"]:
        v.inconclusive(label, "the float64 build of the target, taken through the same steps, gives non-finite "
                              f"maps: a defect {ctx.dtype} does not show here")
        return
    units = "float32" if u_build == FP32_U else storage
    fine = Context(units, u_build, ctx.vocab, ctx.dim).unit(m["cond_T"])
    found = []
    for what, value in ((f"penrose residual ({m['worst_condition']})", m["penrose"]),
                        ("||W E - I||_F / sqrt(D)", m["pinv_drift"] / math.sqrt(ctx.dim)),
                        ("||Z^T Z - I||_2 as the maps show it (eigenvalues of W E)", m["orthonormality"])):
        r = value / fine
        v.result.details.append({"state": label, "measure": f"float64 build: {what}", "raw": value,
                                 "ratio_build_units": r, "build_units": units, "threshold": TAU,
                                 "verdict": "pass" if r <= TAU else "pending"})
        if not r <= TAU:
            found.append((f"{what} {value:.3g} ({r:.3g} {units} units)", v.result.details[-1]))
    if not found:
        return
    shows = f"{label}: the float64 build of the target, taken through the same steps, shows {found[0][0]}"
    start = probe.facts.get("shadow_start", {"tall": ["(not recorded)"]})
    # no V x D tensor to take back to the manifold: the build may carry the stored values' rounding
    carries_rounding = not start["tall"]
    for _, row in found:
        row["verdict"] = "inconclusive" if carries_rounding else "fail"
    if carries_rounding:
        v.unresolved.append(f"{shows}, but it starts from the stored {ctx.dtype} values, whose rounding it "
                            "may carry (no V x D memory tensor was found to take back to the manifold); validate "
                            "in float32 or float64")
    elif not any(f.startswith(f"{label}: ") for f in v.failures):  # the dtype's own failure says it first
        v.failures.append(f"{shows}: a defect of the code, not rounding, which {ctx.dtype}'s own measurement "
                          f"hides here (threshold {TAU * ctx.unit(m['cond_T']):.2g})")


# ---- the checks ------------------------------------------------------------------------------------

def representable_fraction(x: np.ndarray, dtype: str) -> float:
    """Fraction of the non-zero entries of x exactly representable in `dtype` (within its range)."""
    import torch

    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x) & (x != 0)]
    if x.size == 0:
        return 0.0
    t = torch.from_numpy(x)
    back = t.to(getattr(torch, dtype)).to(torch.float64).numpy()
    return float(np.mean(back == x))


def check_contract(probe: Probe, ctx: Context) -> CheckResult:
    v = Verdicts("contract", ctx)
    V, D = ctx.vocab, ctx.dim
    for what, shape in (("embed", [2, 3, D]), ("logits", [2, 3, V])):
        got = probe.facts[what]
        if got["shape"] != shape:
            v.fail(what, f"{what} returned shape {tuple(got['shape'])}, expected {tuple(shape)}")
        if got["dtype"] != ctx.dtype:
            v.fail(what, f"{what} returned {got['dtype']} when {ctx.dtype} was asked for")
    for t in probe.facts["tensors"]:
        # a block-scaled wrapper (torchao's MXTensor) reports the dtype it stands for: judge what it holds
        stored = t.get("stored", t["dtype"])
        bits = element_bits(stored)
        if bits is not None and bits < WIDTH[ctx.dtype]:
            held = f"{stored} elements inside a {t['wrapper']} reporting {t['dtype']}" if "wrapper" in t else stored
            if t.get("read_by_maps") is False:
                # a cast cache for a narrow GEMM elsewhere (FP8 recipes keep one): not what PIT computes with
                v.result.details.append({"state": t["name"], "verdict": "pass",
                                         "reason": f"{t['kind']} {t['name']} is stored in {held}, but neither map "
                                                   "reads it (zeroing it changed neither E nor W)"})
                continue
            v.fail(t["name"], f"{t['kind']} {t['name']} is stored in {held}, narrower than {ctx.dtype}")
    # values computed in a narrower format and cast up are all exactly representable in it; values
    # genuinely computed in the asked format almost never are (a fraction of about 2^-(p - p_narrow)).
    # Judged on computed values only: at initialisation the maps may be stored values (T = I: E = Z), and
    # a map unchanged since then shows nothing computed either.
    initial = [(E, W) for state, E, W in _states(probe) if state.get("at_init")]
    for state, E, W in _states(probe):
        if state.get("at_init") or not NARROWER[ctx.dtype]:
            continue
        for what, x, k in (("embedding", E, 0), ("head", W, 1)):
            if any(np.array_equal(x, maps[k]) for maps in initial):
                v.inconclusive(state["label"], f"the {what} did not change from initialisation: nothing "
                                               f"computed shows the precision it is computed in")
                continue
            for narrow in NARROWER[ctx.dtype]:
                frac = representable_fraction(x, narrow)
                row = {"measure": f"{what} entries exact in {narrow}", "raw": frac}
                if frac > 0.5:
                    v.fail(state["label"], f"{100 * frac:.0f}% of the {what} entries are exact {narrow} values: "
                           f"computed or stored in {narrow}, not {ctx.dtype}", **row)
                else:
                    v.result.details.append({"state": state["label"], "verdict": "pass", **row})
    if not v.failures:
        v.result.details.append({"state": "all", "verdict": "pass", "measure": "shapes and dtypes"})
    result = v.done()
    result.value, result.threshold = None, None  # a yes/no check: no ratio
    return result


def check_penrose(probe: Probe, ctx: Context) -> CheckResult:
    v = Verdicts("penrose", ctx)
    for state, E, W in _states(probe):
        judge_pair(v, state["label"], E, W, ctx)
        judge_shadow(v, probe, state["label"], ctx)
    return v.done()


def check_reference(probe: Probe, ctx: Context) -> CheckResult:
    """The float64 reference rebuilt from the module's own head, W = T Z^T being its polar decomposition:
    from the SVD W = U S V^T, T = U S U^T and Z = V U^T; its embedding (pitcheck.numerics.reference, two
    float64 solves) against the module's, in units of cond(T) u. The SVD of W, not the eigenvalues of
    W W^T: those square cond(T), and a correct module at cond(T) = 1e4 would fail against a reference
    whose own error is cond(T)^2 u. Then the batched maps against the extracted ones (a gather, a
    product): in units of u (D u)."""
    v = Verdicts("reference", ctx)
    for state, E, W in _states(probe):
        label = state["label"]
        if not (np.isfinite(E).all() and np.isfinite(W).all()):
            v.fail(label, "the maps contain non-finite values")
            continue
        U, sv, Vt = np.linalg.svd(W, full_matrices=False)
        if not numerically_full_rank(sv, W.shape):
            v.fail(label, "the head W = T Z^T is rank deficient: T is singular")
            continue
        T = (U * sv) @ U.T
        Z = Vt.T @ U.T
        L = np.linalg.cholesky(0.5 * (T + T.T))
        E_ref = reference.embedding_matrix(Z, L)
        cond = float(sv[0] / sv[-1])
        err = float(np.linalg.norm(E - E_ref) / np.linalg.norm(E_ref))
        v.ratio(label, err, ctx.unit(cond), "embedding forward error", cond_T=cond)
    if "embed_rows" in probe.arrays:
        last = probe.facts["states"][-1]["label"]
        E, W = probe.arrays[f"E:{last}"], probe.arrays[f"W:{last}"]
        for label, ids, rows, H, lg in (
                ("batched", probe.arrays["ids"], probe.arrays["embed_rows"], probe.arrays["hidden"],
                 probe.arrays["logits_rows"]),
                ("(B, T) batches", probe.arrays["ids_grid"], probe.arrays["embed_grid"], probe.arrays["hidden_grid"],
                 probe.arrays["logits_grid"])):
            gathered = E[ids]
            if rows.shape != gathered.shape or lg.shape != H.shape[:-1] + (W.shape[1],):
                v.fail(label, f"embed gave shape {rows.shape} (expected {gathered.shape}), logits {lg.shape}")
                continue
            err = float(np.linalg.norm(rows - gathered) / max(np.linalg.norm(gathered), 1e-300))
            v.ratio(label, err, ctx.unit(), "embed(ids) against rows of the full embedding")
            exact = H @ W
            err = float(np.linalg.norm(lg - exact) / max(np.linalg.norm(H) * np.linalg.norm(W), 1e-300))
            v.ratio(label, err, ctx.unit(), "logits(h) against h W (W = logits(I))")
    return v.done()


def conditioning_ladder(ctx: Context, cap: float = 1e6) -> list[float]:
    """cond(T) targets up to the largest the dtype resolves: TAU unit(cond) <= RESOLVABLE."""
    top = min(cap, RESOLVABLE / (TAU * ctx.unit(1.0)))
    ladder = [c for c in (1e2, 1e4) if c < top]
    if top >= 1e2:
        # rounded down to one significant digit, so the top rung stays resolvable
        ladder.append(float(math.floor(top / 10 ** math.floor(math.log10(top))) * 10 ** math.floor(math.log10(top))))
    return sorted(set(ladder))


def check_conditioning(probe: Probe, ctx: Context) -> CheckResult:
    v = Verdicts("conditioning", ctx)
    ladder = conditioning_ladder(ctx)
    reached = 1.0
    for state, E, W in _states(probe):
        if "attack" in state:
            m = interface(E, W)
            if not m["finite"]:
                v.fail(state["label"], f"with parameter {state['attack']} at zero (weight decay's limit) the maps "
                       "are non-finite and no error was raised: T can become singular")
            elif TAU * ctx.unit(m["cond_T"]) > RESOLVABLE:
                v.result.details.append({"state": state["label"], "verdict": "pass", "cond_T": m["cond_T"],
                                         "reason": "finite; cond(T) beyond what the dtype resolves"})
            else:
                judge_pair(v, state["label"], E, W, ctx)
            continue
        m = judge_pair(v, state["label"], E, W, ctx, cond_target=state.get("cond_target"))
        if m:
            reached = max(reached, m["cond_T"])
    for z in probe.facts.get("zeroed", []):
        if "raised" in z:
            v.result.details.append({"state": f"zeroed {z['parameter']}", "verdict": "pass",
                                     "reason": f"refused: {z['raised']}"})
    if not ladder:
        v.inconclusive("ladder", f"{ctx.dtype} resolves no cond(T) of 1e2 or more (TAU cond u > {RESOLVABLE})")
    elif reached < 0.5 * ladder[-1]:
        v.inconclusive("ladder", f"the module's parameters reached cond(T) = {reached:.3g}, short of {ladder[-1]:.0e}")
    return v.done()


def check_gradients(probe: Probe, ctx: Context) -> CheckResult:
    """Autograd's directional derivative against Richardson-extrapolated central differences (float64
    build for half-precision targets, the dtype under test otherwise; taken no finer than the coarsest
    parameter), and the dtype under test against the float64 build's autograd at the same point, in units
    of unit(cond(T)).

    The differences' own error is measured, not assumed: two central differences at steps t and t/2
    differ by their truncation error plus the rounding noise of the loss over t; the unit is the larger
    of that and the theoretical u_fd^(2/3). A wrong backward is off by O(1), far above either.

    The dtype under test against the float64 autograd: a correct build computes each gradient entry from
    inputs rounded once to the dtype (its memory, the incoming output gradients) with its factor work in
    fp32 or finer, so g_i' = g_i (1 + delta_i) with |delta_i| <= unit(cond(T)). The derivative along d is a
    sum: |sum g_i' d_i - sum g_i d_i| <= unit sum |g_i d_i| (the forward error bound of a dot product). A
    random direction in V D dimensions is nearly orthogonal to the gradient, so |sum g_i d_i| can be
    thousands of times below sum |g_i d_i| (8450 x at V = 2048, D = 32, seed 0), and the derivative's
    relative error is then amplified by that ratio; so its difference is taken relative to
    sum |g_i d_i| (autograd_magnitude, measured on the float64 build). That comparison cannot see a
    wrong backward whose error lies along the gradient (a scaled backward, a missing term), so each
    parameter's gradient is also compared in norm, ||g_p' - g_p|| / ||g_p||: the largest directional
    derivative difference over directions in p's block, relative to the largest derivative, which no
    cancellation hides; by the same componentwise bound it is at most unit(cond(T))."""
    v = Verdicts("gradients", ctx)
    f = probe.facts
    if not f.get("parameters"):
        v.inconclusive("gradients", "the module has no trainable parameters")
        return v.done()
    u_fd = unit_roundoff(f["fd_dtype"])
    ad, fd = f["autograd"], f["finite_difference"]
    scale = max(abs(ad), abs(fd), 1e-300)
    noise = abs(f["fd_at_step"] - f["fd_at_half_step"]) / scale
    # the loss's magnitude bounds the cancellation in the differences
    theory = u_fd ** (2.0 / 3.0) * max(f["loss_scale"], abs(ad)) / scale
    fd_unit = max(theory, noise)
    # what limits the differences: their dtype, or the noise measured in them
    limit = f["fd_dtype"] if theory >= noise else f"the differences' measured noise ({noise:.2g})"
    v.ratio(f"autograd vs finite differences ({f['fd_dtype']})", abs(ad - fd) / scale, fd_unit,
            "directional derivative error", precision=limit, autograd=ad, finite_difference=fd, fd_noise=noise)
    for c in f.get("components", []):
        # the same comparison for one map's term along one parameter's block: which gradient is wrong. The
        # total above judges the whole gradient; a component the differences cannot resolve (a derivative far
        # below its term's size) is shown, and leaves the verdict to the total
        label = f"gradient of {c['parameter']} through {c['map']}"
        row = {"autograd": c["autograd"], "finite_difference": c["finite_difference"]}
        if c["autograd"] == 0 and c["finite_difference"] == 0:
            v.result.details.append({"state": label, "verdict": "pass", "raw": 0.0, **row,
                                     "reason": "no gradient reaches it (autograd and differences both 0)"})
            continue
        c_scale = max(abs(c["autograd"]), abs(c["finite_difference"]))
        c_noise = abs(c["fd_at_step"] - c["fd_at_half_step"]) / c_scale
        c_theory = u_fd ** (2.0 / 3.0) * max(c["loss_scale"], abs(c["autograd"])) / c_scale
        c_unit = max(c_theory, c_noise)
        raw = abs(c["autograd"] - c["finite_difference"]) / c_scale
        if TAU * c_unit > RESOLVABLE:
            v.result.details.append({"state": label, "verdict": "inconclusive", "raw": raw, "fd_noise": c_noise,
                                     "threshold": TAU, **row, "reason": "the differences cannot resolve this "
                                     f"term's derivative (threshold {TAU * c_unit:.2g}): the total judges it"})
            continue
        # resolvable here, so no precision is named: the row's unit is the larger of theory and noise
        v.ratio(label, raw, c_unit, "directional derivative error", fd_noise=c_noise, **row)
    if "autograd_under_test" in f:
        test = f["autograd_under_test"]
        reference = f["reference_dtype"]
        label = f"{ctx.dtype} vs {reference} autograd"
        unit = ctx.unit(f.get("cond_T", 1.0))
        moved = f["state_transfer_error"]
        if not math.isfinite(moved):
            v.inconclusive(label, f"after loading the {reference} build's state_dict the embeddings are not "
                                  "finite: the derivatives cannot be compared")
        elif not moved <= TAU * unit:
            # the checkpoint check judges lost state; here it only makes the two derivatives incomparable
            v.inconclusive(label, f"after loading the {reference} build's state_dict the two builds' "
                                  f"embeddings are {moved:.3g} apart ({moved / unit:.3g} x the unit): not the same "
                                  "point (state outside the state_dict?), so their derivatives are not compared")
        else:
            magnitude = max(f.get("autograd_magnitude", 0.0), abs(ad))
            v.ratio(label, abs(test - ad) / max(magnitude, 1e-300), unit,
                    "directional derivative difference (relative to sum |g_i d_i|)",
                    autograd_under_test=test, state_transfer_error=moved, autograd_magnitude=magnitude)
            blocks = f.get("gradient_blocks", [])
            whole = math.sqrt(sum(b["norm"] ** 2 for b in blocks))
            for b in blocks:
                # a parameter no gradient reaches in float64 is judged against the whole gradient's norm
                norm = b["norm"] if b["norm"] > 0 else whole
                raw = b["difference"] / norm if norm > 0 else (0.0 if b["difference"] == 0 else math.inf)
                v.ratio(f"{ctx.dtype} vs {reference} gradient of {b['parameter']}", raw, unit,
                        "gradient difference (relative to its norm)", gradient_norm=b["norm"],
                        gradient_difference=b["difference"])
    return v.done()


def check_trajectory(probe: Probe, ctx: Context) -> CheckResult:
    """Along the run: Penrose residuals and the memory's orthonormality, each in units of cond(T) u."""
    v = Verdicts("trajectory", ctx)
    states = list(_states(probe))
    if len(states) < 2 or all(np.array_equal(states[0][1], E) and np.array_equal(states[0][2], W)
                              for _, E, W in states[1:]):
        # nothing moved (no steps, an optimizer over the wrong parameters): a pass would say nothing
        v.inconclusive("trajectory", "the module's own steps did not change its maps")
    memory = measured_memory(probe, states)
    for state, E, W in states:
        label = state["label"]
        m = interface(E, W)
        if not m["finite"]:
            v.fail(label, "the maps contain non-finite values")
            continue
        extra = {k: state[k] for k in ("shadow_E", "shadow_W") if k in state}
        unit = ctx.unit(m["cond_T"])
        if memory and "memory_orthonormality" in state:
            # Z measured itself: an error in W E that Z does not have is in the solves or the head
            gap = state["memory_orthonormality"]
            v.ratio(label, m["penrose"], unit, f"penrose residual (with {memory} itself {gap:.2g} off the manifold)",
                    cond_T=m["cond_T"], **extra)
            v.ratio(label, gap, unit, f"memory orthonormality ||Z^T Z - I||_2 of {memory}",
                    maps_orthonormality=m["orthonormality"])
        else:
            v.ratio(label, m["penrose"], unit, "penrose residual", cond_T=m["cond_T"], **extra)
            v.ratio(label, m["orthonormality"], unit, "||Z^T Z - I||_2 as the maps show it (eigenvalues of W E)")
        judge_shadow(v, probe, label, ctx)
    return v.done()


def measured_memory(probe: Probe, states: list) -> str | None:
    """The name of the tensor whose orthonormality the trajectory probe measured, where it is the memory the
    maps use at step 0 (within MEMORY_MATCH); None where only the maps can show it."""
    Z = probe.arrays.get("memory:step 0")
    if Z is None or not states:
        return None
    _, E, W = states[0]
    Z_maps = memory_from_maps(E, W)
    if Z_maps is None or not float(np.linalg.norm(Z - Z_maps)) <= MEMORY_MATCH * float(np.linalg.norm(Z)):
        return None
    return probe.facts.get("memory")


# The retraction check. Its first-order test fits the order of the residual r(t) = ||R(Z + t xi) - (Z + t xi)||
# at two step sizes: 2 for a retraction, 1 for a map off by O(t), 0 for a jump; below this it fails.
ORDER_MIN = 1.5
# A V x D tensor further than this (relative, Frobenius) from the Z the maps show is not the memory (a
# parametrisation's raw tensor): post_step is then not judged as its retraction.
MEMORY_MATCH = 0.1
# post_step must take Z + t xi onto the manifold (within TAU units) or at least this much nearer to it:
# approximate retractions (truncated Cayley series) land O(t^3) off it, a no-op stays where it was.
PULL = 0.5


def stiefel_distance(Y: np.ndarray) -> float:
    """||Y^T Y - I||_2 (a D x D Gram: O(V D^2))."""
    G = Y.T @ Y
    return float(np.max(np.abs(np.linalg.eigvalsh(0.5 * (G + G.T)) - 1.0)))


def memory_from_maps(E: np.ndarray, W: np.ndarray):
    """Z, W's orthonormal polar factor (W = T Z^T, as in check_reference): the memory the maps use; None
    where the maps cannot show it."""
    if not (np.isfinite(E).all() and np.isfinite(W).all()):
        return None
    U, sv, Vt = np.linalg.svd(W, full_matrices=False)
    if not numerically_full_rank(sv, W.shape):
        return None
    return Vt.T @ U.T


def check_retraction(probe: Probe, ctx: Context) -> CheckResult:
    """post_step as a retraction of the stored memory Z: R(Z, 0) = Z within units of u of the dtype under
    test; R(Z + t xi) - (Z + t xi) = O(t^2) for a tangent xi (fitted order >= ORDER_MIN, the residual at the
    larger step within TAU units of t^2 ||xi||^2 / ||Z||); and R(Z + t xi) on the manifold or nearer it."""
    v = Verdicts("retraction", ctx)
    f = probe.facts
    if not f.get("post_step"):
        v.inconclusive("post_step", "the module has no post_step: no retraction to judge (a parametrisation keeps "
                                    "Z on the manifold, or nothing does: the trajectory check judges that)")
        return v.done()
    if "memory" not in f:
        v.inconclusive("memory", "the optimizer moves no trainable V x D tensor: post_step retracts no memory")
        return v.done()
    Z, R0 = probe.arrays["Z"], probe.arrays["R0"]
    size = float(np.linalg.norm(Z))
    _, E, W = next(_states(probe))
    Z_maps = memory_from_maps(E, W)
    if Z_maps is not None:
        apart = float(np.linalg.norm(Z - Z_maps)) / size
        if not apart <= MEMORY_MATCH:
            v.inconclusive("memory", f"the tensor {f['memory']} is {apart:.3g} (relative) from the Z the maps use: "
                                     "not the memory itself, so post_step is not judged as its retraction")
            return v.done()
    shifts = []
    for label, start, end in (("R(Z, 0)", Z, R0), ("R(Z Q, 0)", probe.arrays["ZQ"], probe.arrays["RQ"])):
        if not np.isfinite(end).all():
            v.fail(label, "post_step on a point of the manifold returned non-finite values")
            return v.done()
        shifts.append(float(np.linalg.norm(end - start)) / size)
        v.ratio(label, shifts[-1], ctx.unit(1.0), "displacement ||post_step(X) - X||_F / ||X||_F of X on the manifold")
    moved = max(shifts)
    # what rounding leaves in a residual: the memory's own unit, or what post_step(Z) measurably moved
    noise = max(Context(f["memory_dtype"], unit_roundoff(f["memory_dtype"]), ctx.vocab, ctx.dim).unit(1.0), moved)
    residual = {metric: {} for metric in FIRST_ORDER}
    for t in f["steps"]:
        X, Y = probe.arrays[f"X:{t!r}"], probe.arrays[f"Y:{t!r}"]
        label = f"t = {t:g}"
        if not np.isfinite(Y).all():
            v.fail(label, "post_step returned non-finite values")
            continue
        for metric, first_order in FIRST_ORDER.items():
            residual[metric][t] = float(np.linalg.norm(Y - first_order(Z, X))) / size
        before, after = stiefel_distance(X), stiefel_distance(Y)
        row = {"measure": "||Y^T Y - I||_2 after post_step", "raw": after, "before": before}
        if after <= TAU * ctx.unit(1.0) or after <= PULL * before:
            v.result.details.append({"state": label, "verdict": "pass", **row})
        else:
            v.fail(label, f"post_step left Z + t xi off the manifold: ||Z^T Z - I||_2 {after:.3g} after it, "
                          f"{before:.3g} before (a retraction lands on the manifold)", **row)
    if len(residual["embedded"]) < 2:
        return v.done()
    big, small = max(residual["embedded"]), min(residual["embedded"])
    if TAU * noise > 0.5 * small**2:
        v.inconclusive("first order", f"rounding in post_step ({noise:.2g}: the memory is {f['memory_dtype']}, "
                                      f"post_step(Z) moved it {moved:.2g}) hides the O(t^2) residual at t = {small:g}")
        return v.done()
    # a residual at rounding level fits no order (a no-op at one step size; two metrics that agree when the
    # move has no in-span part)
    orders = {metric: _order(r[big], r[small], big, small) if min(r[big], r[small]) > noise else math.nan
              for metric, r in residual.items()}
    found = next((metric for metric, order in orders.items() if order >= ORDER_MIN), None)
    shown = found or "embedded"
    r_big, r_small = residual[shown][big], residual[shown][small]
    row = {"measure": f"order of ||R(Z + t xi) - (Z + t xi)|| (t = {big:g}, {small:g})", "raw": orders[shown],
           "residuals": [r_big, r_small], "metric": found,
           **{f"order_{metric}": order for metric, order in orders.items()}}
    sizes = f"{r_big:.3g} at t = {big:g}, {r_small:.3g} at t = {small:g}"
    if found:
        v.result.details.append({"state": "first order", "verdict": "pass",
                                 "reason": f"a retraction for the {found} metric ({METRIC_NAMES[found]})", **row})
    elif math.isnan(orders["embedded"]):
        v.fail("first order", f"post_step(Z + t xi) - (Z + t xi) is {sizes}: no order can be fitted "
                              "(post_step left the point where it was)", **row)
    else:
        v.fail("first order", f"post_step(Z + t xi) - (Z + t xi) scales as t^{orders['embedded']:.2g}, not t^2 "
                              f"({sizes}), and as t^{orders['canonical']:.2g} against the canonical metric's "
                              "first-order move: a retraction for neither metric", **row)
    v.ratio(f"t = {big:g}", r_big, big**2, f"||post_step(Z + t xi) - (Z + t xi)||_F / ||Z||_F in units of t^2 "
                                           f"({shown} metric)")
    return v.done()


def _order(r_big: float, r_small: float, big: float, small: float) -> float:
    """The fitted order p of r(t) ~ t^p from two step sizes (nan where a residual is zero)."""
    return math.log(r_big / r_small) / math.log(big / small) if r_big > 0 and r_small > 0 else math.nan


# The first-order move a retraction must follow from Z when the optimizer has moved the memory to X = Z + t xi,
# by metric (Absil, Mahony and Sepulchre: dR_Z(0)[xi] = xi, the tangent being the metric's own). The embedded
# metric's is the move itself. The canonical metric's, tr(A^T (I - Z Z^T / 2) B), is G - Z G^T Z for the move
# G = X - Z: Wen and Yin's Cayley transform with W = G Z^T - Z G^T, whose in-span (skew) part is doubled.
FIRST_ORDER = {
    "embedded": lambda Z, X: X,
    "canonical": lambda Z, X: Z + (X - Z) - Z @ ((X - Z).T @ Z),
}
METRIC_NAMES = {"embedded": "dR(0)[xi] = xi: QR, polar, Cholesky-QR, Cayley on the projected move",
                "canonical": "dR(0)[xi] = xi - Z xi^T Z: Wen and Yin's Cayley with W = G Z^T - Z G^T"}


def check_checkpoint(probe: Probe, ctx: Context) -> CheckResult:
    v = Verdicts("checkpoint", ctx)
    maps = {s["label"]: (E, W) for s, E, W in _states(probe)}

    def compare(label, a, b):
        for what, x, y in (("embedding", a[0], b[0]), ("head", a[1], b[1])):
            if not (np.isfinite(x).all() and np.isfinite(y).all()):
                v.fail(label, f"the {what} is non-finite")
                continue
            diff = float(np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-300))
            v.ratio(label, diff, ctx.u, f"{what} difference")

    compare("loaded vs saved", maps["before"], maps["loaded"])
    compare("one step after resume", maps["uninterrupted after step"], maps["resumed after step"])
    return v.done()


def check_bad_input(probe: Probe, ctx: Context) -> CheckResult:
    v = Verdicts("bad_input", ctx)
    cases = probe.facts["cases"]
    rows = probe.arrays["rows_0_last"]
    clean = probe.arrays["clean_logits"]
    for name, r in cases.items():
        if "raised" in r:
            v.result.details.append({"state": name, "verdict": "pass", "reason": f"refused: {r['raised']}"})
            continue
        value = probe.arrays[f"value:{name}"]
        if name == "empty batch":
            if list(value.shape) == [0, ctx.dim]:
                v.result.details.append({"state": name, "verdict": "pass", "reason": "empty (0, D) result"})
            else:
                v.fail(name, f"an empty batch gave shape {tuple(value.shape)}, not (0, {ctx.dim})")
        elif name.startswith("id ") or name == "float ids":
            # the probe embeds [a valid id, the bad one]: a (2, D) result is expected, its second row non-finite
            two_rows = value.ndim == 2 and value.shape[0] == 2
            if two_rows and not np.isfinite(value[1]).all():
                v.result.details.append({"state": name, "verdict": "pass", "reason": "non-finite row"})
            elif name == "id -1" and value.shape == rows.shape and np.array_equal(value[1], rows[1]):
                v.fail(name, "id -1 silently returned the embedding of token V-1 (negative index wraps)")
            elif not two_rows:
                v.fail(name, f"{name} returned an array of shape {tuple(value.shape)} instead of an error "
                             f"(a batch of 2 ids should give 2 rows)")
            else:
                v.fail(name, f"{name} returned finite numbers instead of an error")
        else:  # a non-finite hidden row: its logits non-finite, the others untouched
            if value.shape != clean.shape:
                v.fail(name, f"logits of shape {value.shape}, expected {clean.shape}")
            elif np.isfinite(value[1]).all():
                v.fail(name, "a non-finite hidden state gave finite logits")
            elif not (np.isfinite(value[[0, 2]]).all()):
                v.fail(name, "the non-finite hidden row spread to the other rows' logits")
            else:
                err = float(np.linalg.norm(value[[0, 2]] - clean[[0, 2]]) / np.linalg.norm(clean[[0, 2]]))
                v.ratio(name, err, ctx.unit(), "other rows' change")
    return v.done()


def check_scale(probe: Probe, ctx: Context) -> CheckResult:
    """logits(2^k h) = 2^k logits(h) exactly while nothing over- or underflows; beyond the range the
    overflow must show (inf, NaN or an error), never a finite wrong number."""
    v = Verdicts("scale", ctx)
    base, hid = probe.arrays["base"], probe.arrays["hidden"]
    fmax, tiny = probe.facts["max"], probe.facts["tiny"]
    if not np.isfinite(base).all():
        v.fail("c = 1", "logits of an ordinary hidden state are non-finite")
        return v.done()
    # Python floats: c times them beyond the float64 range is inf without a warning
    hmax, bmax = float(np.abs(hid).max()), float(np.abs(base).max())
    bmin = float(np.abs(base[base != 0]).min()) if np.any(base != 0) else 0.0
    hmin = float(np.abs(hid[hid != 0]).min()) if np.any(hid != 0) else 0.0
    for s in probe.facts["scaled"]:
        k = s["exponent"]
        c = 2.0**k
        label = f"c = 2^{k}"
        # safe: inputs, outputs (and, for T near I, intermediates) well inside the normal range
        safe = c * max(hmax, bmax) <= fmax / 64 and c * min(bmin, hmin) >= tiny / ctx.u
        overflow = c * bmax > fmax or c * hmax > fmax
        if "raised" in s:
            if safe:
                v.fail(label, f"raised for a representable input and output: {s['raised']}")
            else:
                v.result.details.append({"state": label, "verdict": "pass", "reason": f"refused: {s['raised']}"})
            continue
        out = probe.arrays[f"scaled:{k}"]
        with np.errstate(over="ignore"):  # c logits(h) beyond the float64 range is inf, as it should compare
            expected = c * base
        if overflow:
            if np.isfinite(out).all() and not np.allclose(out, expected, rtol=TAU * ctx.unit(), atol=0):
                v.fail(label, "the logits overflow the dtype, yet finite numbers came back")
            else:
                v.result.details.append({"state": label, "verdict": "pass", "reason": "overflow shows"})
        elif not np.isfinite(out).all():
            if safe:
                v.fail(label, f"non-finite logits although c logits(h) is at most {c * bmax:.3g}")
            else:  # near the edge of the range an intermediate may overflow: shown, not silent
                v.result.details.append({"state": label, "verdict": "pass", "reason": "overflow shows"})
        elif c * bmin >= tiny / ctx.u:  # below that, subnormal outputs legitimately lose digits
            # compared after dividing by c = 2^k (exact): norms of tiny or huge values under- or overflow
            err = float(np.linalg.norm(out / c - base) / np.linalg.norm(base))
            v.ratio(label, err, ctx.unit(), "relative error of logits(c h) against c logits(h)")
    return v.done()


register(
    Check("contract", probe_contract, check_contract),
    Check("penrose", probe_penrose, check_penrose),
    Check("reference", probe_reference, check_reference),
    Check("conditioning", probe_conditioning, check_conditioning),
    Check("gradients", probe_gradients, check_gradients),
    Check("trajectory", probe_trajectory, check_trajectory),
    Check("retraction", probe_retraction, check_retraction),
    Check("checkpoint", probe_checkpoint, check_checkpoint),
    Check("bad_input", probe_bad_input, check_bad_input),
    Check("scale", probe_scale, check_scale),
)
# name -> judge of the checks every target has: a view of the registry
CHECKS = {name: check.judge for name, check in CHECK_RECORDS.items() if not check.sharded}


def judge(name: str, probe: Probe, ctx: Context) -> CheckResult:
    """The verdict of check `name` on what the target's process recorded for it (`probe`), in units of
    `ctx`. A probe that stopped on an exception fails the target when the target raised or breached its
    contract, and is an error when pitcheck's own probe stopped with no breach found; otherwise the
    check's registered judge (the sharded checks' too) judges the values, and values without the structure
    it needs fail."""
    if "error" in probe.facts:
        f = probe.facts
        where = f" at {f['where']}" if f.get("where") else ""
        by = f.get("by", "target")
        if by == "breach":
            return CheckResult(name, "fail", reason=f["error"])
        if by == "probe":
            stopped = f"pitcheck's probe stopped{where}: {f['error']}"
            if f.get("breach"):
                return CheckResult(name, "fail", reason=f"{f['breach']} ({stopped})")
            return CheckResult(name, "error", reason=f"{stopped} (on what the target returned; its own code raised "
                                                     "nothing and no breach of its contract was found)")
        return CheckResult(name, "fail", reason=f"the target raised {f['error']}{where}")
    try:
        return CHECK_RECORDS[name].judge(probe, ctx)
    except (KeyError, ValueError, IndexError, np.linalg.LinAlgError) as exc:
        # what the target returned did not have the structure the check needs (a missing state, a wrong shape)
        return CheckResult(name, "fail", reason=f"could not judge what the target returned: {type(exc).__name__}: {exc}")
