"""Gradient models (the adversaries), registered by name.

Each model is `f(Z, L, rng, params, probe) -> (G_Z, G_L)` on float64 numpy copies of the model being
stressed, registered with the AdversaryParams fields it reads (`default_params(name)` gives them):
G_Z is V x D, G_L is D x D (only its lower triangle is used). The stream is defined in float64
numpy for every backend, so a low-precision torch run and its float64 shadow see the same gradients.
Models compose by summing: "dense_output,spike" is the dense output gradient plus occasional bursts.
Each component draws from its own stream, seeded by (seed, step, component index): a run resumed at
any step regenerates exactly the gradients it would have seen.

Two streams (a run's `gradient_stream`): "numpy", the float64 numpy draw above on the host, which every
model has; and "counter", for the models whose draw reads no state of the model (their record's `counter`
form): standard normals from pitcheck.numerics.counter_normal, a pure function of (seed, step, key) drawn in
float64 where the run computes, the same bits on the CPU and on CUDA, with no V x D array crossing to or
from the host. The two streams are different numbers: a run names the one it draws.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Callable

import numpy as np
import scipy.linalg

from ..infra.errors import PitcheckError
from ..numerics.metrics import drift_bound

FP64_U = 2.0**-53

GRADIENT_MODELS: dict[str, Callable] = {}
# the AdversaryParams fields each model reads
MODEL_PARAMETERS: dict[str, tuple[str, ...]] = {}
# each model's form on the counter stream, where it has one: f(shapes, seed, step, key, device) -> (G_Z, G_L)
COUNTER_FORMS: dict[str, Callable] = {}
GRADIENT_STREAMS = ("numpy", "counter")


@dataclass(frozen=True)
class AdversaryParams:
    batch: int = 32  # tokens per step for the output and input channels
    zipf_exponent: float = 1.1  # token frequencies p_v ~ 1/(v+1)^s
    input_scale: float = 1.0  # scale of input-side gradients against output-side ones
    spike_probability: float = 0.01
    spike_scale: float = 100.0
    burst_probability: float = 0.1
    burst_scale: float = 10.0
    normal_scale: float = 100.0  # off-manifold gradients are large: only projection error survives
    attack_scale: float = 1.0
    nonfinite_probability: float = 0.05


# what each parameter may be: a probability, a non-negative scale or exponent, a positive count
PROBABILITIES = ("spike_probability", "burst_probability", "nonfinite_probability")


def check_adversary_params(params: AdversaryParams) -> None:
    """Every parameter finite and in its range (a NaN scale would silently skip every step); one line if not."""
    for f in fields(params):
        value = getattr(params, f.name)
        label = "--input-scale" if f.name == "input_scale" else f"adversary_params.{f.name}"
        if f.name == "batch":
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise PitcheckError(f"{label} must be a positive integer, got {value!r}")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                or not math.isfinite(value) or value < 0:
            raise PitcheckError(f"{label} must be a finite number >= 0, got {value!r}")
        if f.name in PROBABILITIES and value > 1:
            raise PitcheckError(f"{label} is a probability: it must be in [0, 1], got {value!r}")


def register(name: str, params: tuple[str, ...] = (), counter: Callable | None = None):
    """Register a model under name; `params`: the AdversaryParams fields it reads; `counter`: its form on the
    counter stream, if it has one. A name is registered once."""
    if name in GRADIENT_MODELS:
        raise PitcheckError(f"gradient model {name!r} is registered already")
    unknown = set(params) - {f.name for f in fields(AdversaryParams)}
    if unknown:
        raise PitcheckError(f"gradient model {name!r} reads no such parameter: {', '.join(sorted(unknown))}")

    def deco(fn):
        GRADIENT_MODELS[name] = fn
        MODEL_PARAMETERS[name] = tuple(params)
        if counter is not None:
            COUNTER_FORMS[name] = counter
        return fn

    return deco


def default_params(name: str) -> dict:
    """The parameters the named model reads, at their defaults ({field: value}; the same as AdversaryParams())."""
    check_model(name)
    defaults = AdversaryParams()
    return {f: getattr(defaults, f) for f in MODEL_PARAMETERS[name]}


def parse_adversary(spec: str) -> list[str]:
    """The gradient models an adversary spec ("gaussian,dense_output") sums; a run resolves it once (its plan)."""
    return _model_names(spec)


def _model_names(spec: str) -> list[str]:
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise PitcheckError("empty --adversary; choose from " + ", ".join(GRADIENT_MODELS))
    for n in names:
        check_model(n)
    return names


def check_stream(stream: str, names: list[str]) -> None:
    """The stream is known and every model named has a form on it; a one-line reason if not."""
    if stream not in GRADIENT_STREAMS:
        raise PitcheckError(f"unknown gradient stream {stream!r}; choose from {', '.join(GRADIENT_STREAMS)}")
    missing = [n for n in names if stream == "counter" and n not in COUNTER_FORMS]
    if missing:
        raise PitcheckError(f"--gradient-stream counter draws {', '.join(COUNTER_FORMS)} only; "
                            f"{', '.join(missing)} has no counter form (--gradient-stream numpy draws every model)")


def counter_key(component: int, part: int, stream: int = 0) -> int:
    """The counter stream's key word of a summed model's component (its index in the adversary), a part (0: G_Z,
    1: G_L) and a table's stream (1: an untied head's second table): distinct for every triple."""
    return component * 4 + stream * 2 + part


def counter_gradient(names: list[str], shapes: tuple[tuple, tuple], seed: int, step: int, device,
                     stream: int = 0):
    """The sum of the named models' counter forms: float64 torch tensors (G_Z, G_L) on `device`."""
    total = None
    for index, name in enumerate(names):
        g = COUNTER_FORMS[name](shapes, seed, step, lambda part: counter_key(index, part, stream), device)
        total = g if total is None else (total[0] + g[0], total[1] + g[1])
    return total


def check_model(name: str) -> None:
    if name not in GRADIENT_MODELS:
        raise PitcheckError(f"unknown gradient model {name!r}; choose from {', '.join(GRADIENT_MODELS)}")


def gradient(spec: str | list[str], Z, L, seed: int, step: int, params: AdversaryParams, probe=None,
             stream: int = 0):
    """Sum of the named models' gradients at this step, each from its own seeded stream.

    `stream` > 0 draws an independent copy of the whole stream (an untied head's second table).
    """
    names = _model_names(spec) if isinstance(spec, str) else spec
    GZ = np.zeros_like(Z)
    GL = np.zeros_like(L)
    # a state that has overflowed gives non-finite gradients: the engine records them as an event (a skipped
    # step), so numpy's warnings about them would only be noise on a run's progress bar
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for index, name in enumerate(names):
            rng = np.random.default_rng([seed, step, index] + ([stream] if stream else []))
            gz, gl = GRADIENT_MODELS[name](Z, L, rng, params, probe)
            GZ += gz
            GL += gl
    return GZ, GL


def _gaussian(shape, rng):
    # entries N(0, 1/n) so the Frobenius norm is about 1 whatever the size; math.sqrt of the entry count
    # is the same correctly rounded double as np.sqrt(np.prod(shape)), at a thirtieth of the call cost
    return rng.standard_normal(shape) / math.sqrt(math.prod(shape))


@functools.lru_cache(maxsize=32)
def _zipf_probabilities(vocab: int, exponent: float) -> np.ndarray:
    """p_k proportional to k^-exponent, computed once per (vocab, exponent): the same bits every call, so
    the draws are those of recomputing it (V powers a step were a third of a small step's id draw)."""
    weights = 1.0 / np.arange(1, vocab + 1) ** exponent
    p = weights / weights.sum()
    p.flags.writeable = False
    return p


@functools.lru_cache(maxsize=32)
def _zipf_cdf(vocab: int, exponent: float) -> np.ndarray:
    """The cumulative distribution numpy's Generator.choice(vocab, p=p) builds from p on every call
    (p.cumsum(), then divided by its last entry), built once per (vocab, exponent)."""
    if vocab < 1:  # choice's own refusal, word for word
        raise ValueError("a must be a positive integer unless no samples are taken")
    cdf = _zipf_probabilities(vocab, exponent).cumsum()
    cdf /= cdf[-1]
    cdf.flags.writeable = False
    return cdf


def _zipf_ids(vocab: int, count: int, exponent: float, rng) -> np.ndarray:
    """`count` ids drawn as rng.choice(vocab, size=count, p=zipf probabilities) draws them, bit for bit
    and consuming the same `count` uniforms from rng: choice with replacement and p searches its CDF
    for rng.random(count) (side='right'). Choice's per-call checks of p and its CDF were ~10 us of a
    ~12 us draw; tests/model/test_gradient_stream_exact.py holds the two equal."""
    return _zipf_cdf(vocab, exponent).searchsorted(rng.random(count), side="right")


def _cho_solve_lower(L, B):
    """scipy.linalg.cho_solve((L, True), B) for sparse_input's arrays: the LAPACK potrs it picks, called
    on the same arguments, so the same bits, without the wrapper's per-call cost (its checks and
    conversions were ~8 us of a ~12 us solve at D = 8). Input it would refuse (non-finite, or an L that
    is not the square factor B's rows need) or answer specially (an empty B) goes through cho_solve
    itself, which raises or returns as it always did."""
    if not (L.shape == (B.shape[0],) * 2 and B.size and np.isfinite(L).all() and np.isfinite(B).all()):
        return scipy.linalg.cho_solve((L, True), B)
    potrs, = scipy.linalg.get_lapack_funcs(("potrs",), (L, B))
    # potrs's info is non-zero only for an illegal argument (a size or leading dimension), which f2py
    # derives from the arrays themselves, refusing shapes that do not fit before LAPACK is called
    x, _info = potrs(L, B, lower=True, overwrite_b=False)
    return x


def _factor_gradient(GT, L):
    # dT = dL L^T + L dL^T, so a loss gradient G_T on T gives G_L = (G_T + G_T^T) L
    return (GT + GT.T) @ L


def _counter_gaussian(shapes, seed, step, key, device):
    """gaussian's counter form: N(0, 1/n) entries as in _gaussian, from counter normals."""
    from ..numerics.counter_normal_fused import normals  # deferred: it imports torch (and Triton where there is one)

    return tuple(normals(shape, seed, step, key(part), device=device) / math.sqrt(math.prod(shape))
                 for part, shape in enumerate(shapes))


@register("gaussian", counter=_counter_gaussian)
def gaussian(Z, L, rng, params, probe):
    """Isotropic noise, ||G_Z||_F ~ 1 and ||G_L||_F ~ 1."""
    return _gaussian(Z.shape, rng), _gaussian(L.shape, rng)


@register("dense_output", ("batch", "zipf_exponent"))
def dense_output(Z, L, rng, params, probe):
    """Cross-entropy gradient of the head (h T) Z^T at Zipf-distributed targets: every row of Z moves."""
    V, D = Z.shape
    h = rng.standard_normal((params.batch, D))
    hT = (h @ L) @ L.T
    logit = hT @ Z.T
    logit -= logit.max(axis=1, keepdims=True)
    prob = np.exp(logit)
    prob /= prob.sum(axis=1, keepdims=True)
    targets = _zipf_ids(V, params.batch, params.zipf_exponent, rng)
    prob[np.arange(params.batch), targets] -= 1.0
    dlogit = prob / params.batch  # B x V, O(B V)
    GZ = dlogit.T @ hT
    GT = h.T @ (dlogit @ Z)
    return GZ, _factor_gradient(GT, L)


@register("sparse_input", ("batch", "zipf_exponent", "input_scale"))
def sparse_input(Z, L, rng, params, probe):
    """Input-side gradient: only the rows of the batch's (Zipf) tokens move, scaled by input_scale."""
    V, D = Z.shape
    ids = _zipf_ids(V, params.batch, params.zipf_exponent, rng)
    upstream = rng.standard_normal((params.batch, D)) / math.sqrt(D)  # dLoss/de_v (np.sqrt(D)'s bits)
    # e_v = T^{-1} z_v: dLoss/dz_v = T^{-1} g_v and dLoss/dT = -sum_v T^{-1} g_v e_v^T
    Tinv_g = _cho_solve_lower(L, upstream.T).T
    e = _cho_solve_lower(L, Z[ids].T).T
    GZ = np.zeros_like(Z)
    np.add.at(GZ, ids, Tinv_g)
    GT = -Tinv_g.T @ e
    return params.input_scale * GZ, params.input_scale * _factor_gradient(0.5 * (GT + GT.T), L)


@register("normal", ("normal_scale",))
def normal(Z, L, rng, params, probe):
    """Off-manifold gradient Z S (S symmetric): exactly normal, so all that enters is projection error."""
    S = _gaussian((Z.shape[1],) * 2, rng)
    return params.normal_scale * Z @ (S + S.T), np.zeros_like(L)


@register("spike", ("spike_probability", "spike_scale"))
def spike(Z, L, rng, params, probe):
    """With probability spike_probability, a Gaussian burst spike_scale times the usual size."""
    if rng.random() >= params.spike_probability:
        return np.zeros_like(Z), np.zeros_like(L)
    return params.spike_scale * _gaussian(Z.shape, rng), params.spike_scale * _gaussian(L.shape, rng)


@register("heavy_tail")
def heavy_tail(Z, L, rng, params, probe):
    """Student-t entries with 1.5 degrees of freedom: finite mean, infinite variance."""
    n_z, n_l = Z.size, L.size
    return (
        rng.standard_t(1.5, Z.shape) / np.sqrt(n_z),
        rng.standard_t(1.5, L.shape) / np.sqrt(n_l),
    )


@register("rank1", ("burst_probability", "burst_scale"))
def rank1(Z, L, rng, params, probe):
    """With probability burst_probability, a rank-1 burst (Z c) d^T lying in the span of Z."""
    if rng.random() >= params.burst_probability:
        return np.zeros_like(Z), np.zeros_like(L)
    D = Z.shape[1]
    c = rng.standard_normal(D)
    d = rng.standard_normal(D)
    return params.burst_scale * np.outer(Z @ (c / np.linalg.norm(c)), d / np.linalg.norm(d)), np.zeros_like(L)


@register("conditioning", ("attack_scale",))
def conditioning(Z, L, rng, params, probe):
    """Drives sigma_min(L) down: G_L = tril(u v^T) for the smallest singular pair of L.

    A descent step L - lr G_L changes sigma_min by -lr sum_{i>=j} u_i^2 v_j^2 <= 0.
    """
    U, s, Vt = np.linalg.svd(L)
    G = np.tril(np.outer(U[:, -1], Vt[-1]))
    return np.zeros_like(Z), params.attack_scale * G / np.linalg.norm(G)


@register("nonfinite", ("nonfinite_probability",))
def nonfinite(Z, L, rng, params, probe):
    """Gaussian noise with a NaN or Inf entry at probability nonfinite_probability (bad-input test)."""
    GZ, GL = gaussian(Z, L, rng, params, probe)
    if rng.random() < params.nonfinite_probability:
        GZ[rng.integers(Z.shape[0]), rng.integers(Z.shape[1])] = rng.choice([np.nan, np.inf, -np.inf])
    return GZ, GL


ADAPTIVE_CANDIDATES = ("gaussian", "dense_output", "rank1", "normal", "conditioning")


@register("adaptive", tuple(dict.fromkeys(f for n in ADAPTIVE_CANDIDATES for f in MODEL_PARAMETERS[n])))
def adaptive(Z, L, rng, params, probe):
    """Of the candidate models' gradients this step, the one whose trial step grows the tracked error most.

    The tracked error is the drift bound cond(T) (||Z^T Z - I||_F + u) after a trial step through the
    run's own optimizer and retraction (`probe`); without a probe it is judged at Z + G.
    """
    best, best_err = None, -np.inf
    for name in ADAPTIVE_CANDIDATES:
        child = np.random.default_rng(rng.integers(2**63))
        g = GRADIENT_MODELS[name](Z, L, child, params, None)
        if probe is not None:
            err = probe(*g)
        else:
            try:
                err = drift_bound(Z - g[0], L - np.tril(g[1]), FP64_U)
            except PitcheckError:  # the trial point's T is singular: the worst a candidate can do
                err = np.inf
        if err > best_err:
            best, best_err = g, err
    return best

