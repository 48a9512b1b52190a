"""Hypothesis search over the metrics API with arbitrary arrays: every call gives a PitcheckError or
finite values, never another exception. Run as `python -m tests.fuzz_metrics N` (N examples per
function); test_metrics_validation.py runs it in a child process under a time limit, since a hang
inside LAPACK cannot be interrupted from Python."""
import sys

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pitcheck import PitcheckError
from pitcheck.numerics import metrics

ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True, width=64)
# a sprinkling of the values that break things: zeros, subnormals, huge, non-finite
NASTY = st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 1e-30, 1.0, -1.0, 1e30, 1e300, 1.7e308, np.inf, -np.inf, np.nan])


@st.composite
def matrices(draw, rows=None, cols=None):
    v = rows if rows is not None else draw(st.integers(0, 10))
    d = cols if cols is not None else draw(st.integers(0, 6))
    kind = draw(st.sampled_from(["orthonormal", "gaussian", "arbitrary", "ints", "torch"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "orthonormal" and v >= d >= 1:
        a = np.linalg.qr(rng.standard_normal((v, d)))[0]
    elif kind == "arbitrary":
        a = draw(hnp.arrays(np.float64, (v, d), elements=st.one_of(ANY_FLOAT, NASTY)))
    elif kind == "ints":
        a = draw(hnp.arrays(np.int64, (v, d), elements=st.integers(-3, 3)))
    else:
        a = rng.standard_normal((v, d)) * 10.0 ** draw(st.integers(-300, 300))
    if draw(st.booleans()) and a.size:  # poke a nasty value in
        a = a.astype(np.float64)
        a.flat[draw(st.integers(0, a.size - 1))] = draw(NASTY)
    if kind == "torch":
        import torch

        dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32, torch.float64]))
        return torch.from_numpy(np.asarray(a, dtype=np.float64)).to(dtype)
    return a


@st.composite
def factors(draw, d=None):
    d = d if d is not None else draw(st.integers(0, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    L = np.tril(rng.standard_normal((d, d)))
    L[np.diag_indices(d)] = np.abs(L.diagonal()) * 10.0 ** draw(st.integers(-200, 200))
    shape = draw(st.sampled_from(["factor", "factor", "upper", "any"]))
    if shape == "upper" and d > 1:
        L[0, -1] = 1.0
    elif shape == "any":
        return draw(matrices(d, d))
    if draw(st.booleans()) and d:
        L.flat[draw(st.integers(0, L.size - 1))] = draw(NASTY)
    return L


UNITS = st.one_of(st.sampled_from([2.0**-53, 2.0**-24, 2.0**-8, 0.0, -1e-3, 1.0, np.nan, np.inf]), ANY_FLOAT)


def outcome(f, *args, **kw):
    """Call f; a PitcheckError is a fine answer, otherwise every number it returns must be finite."""
    try:
        out = f(*args, **kw)
    except PitcheckError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    values = out.values() if isinstance(out, dict) else [out]
    for v in values:
        if isinstance(v, (bool, list)):
            continue
        assert np.isfinite(v), (f.__name__, out)


@st.composite
def pit_inputs(draw):
    """Z, L and E of matching shapes (mostly), arbitrary contents."""
    v, d = draw(st.integers(1, 10)), draw(st.integers(1, 6))
    Z = draw(matrices(v, d))
    L = draw(factors(d))
    if draw(st.booleans()) and isinstance(Z, np.ndarray) and isinstance(L, np.ndarray) and L.shape == (d, d):
        try:
            E = np.linalg.solve(L @ L.T, np.asarray(Z, dtype=np.float64).T).T  # the exact embedding rows
        except (np.linalg.LinAlgError, ValueError, FloatingPointError):
            E = draw(matrices(v, d))
    else:
        E = draw(matrices(v, d) if draw(st.booleans()) else matrices())
    return Z, L, E


def main(examples: int) -> None:
    cfg = settings(max_examples=examples, deadline=None, database=None,
                   suppress_health_check=list(HealthCheck))

    @cfg
    @given(matrices(), UNITS)
    def single(Z, u):
        outcome(metrics.orthonormality_loss, Z)
        outcome(metrics.orthonormality_ratio, Z, u)

    @cfg
    @given(factors(), UNITS)
    def conditioning(L, u):
        outcome(metrics.cholesky_conditioning, L, u)

    @cfg
    @given(pit_inputs())
    def pairs(zle):
        _, _, E = zle
        B = zle[0]
        outcome(metrics.pinv_drift, E, B)
        outcome(metrics.penrose_residuals, E, B)
        outcome(metrics.pinv_error, E, B)
        outcome(metrics.head_metrics, E, B)

    @cfg
    @given(pit_inputs(), UNITS, st.one_of(st.none(), UNITS), st.sampled_from([1, 3, 256, 0, -1, 2.5]))
    def interface(zle, u, factor_u, sample_rows):
        Z, L, E = zle
        outcome(metrics.interface_metrics, Z, L, E, u, factor_u, sample_rows)
        ids = np.arange(min(3, np.shape(Z)[0]))
        rows = E[ids] if np.shape(E)[0] >= len(ids) else E
        outcome(metrics.trisolve_errors, Z, L, rows, ids, u)

    for search in (single, conditioning, pairs, interface):
        search()
        print(f"{search.__name__}: {examples} examples, no uncaught exception, no non-finite value", flush=True)


if __name__ == "__main__":
    with np.errstate(all="ignore"):
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
