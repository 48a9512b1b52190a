"""A scenario on the user's own module: `target = "package.module:make"` or `"path/file.py:make"`.

The target is validate's (pitcheck.verbs.validate.target): `make(vocab_size, hidden_size, *, dtype, device,
seed)` returns a torch module with embed(ids), logits(h), optionally post_step() and configure_optimizer.
It runs in a child process with a time limit (validate's isolation; target_worker.py is what runs there),
stepped on the scenario's gradient models as losses on its outputs. pitcheck's own process reads the maps
E = embed(0..V-1) and W = logits(I_D) saved at each recorded step and measures what a run records where it
applies to a module seen from outside (TARGET_METRICS): the memory's orthonormality ||Z^T Z - I||_F read
off the maps (W E = T Z^T Z T^-1 is similar to Z^T Z, so the root sum of squares of its eigenvalues' distances
from 1 is that norm: the column every run records), cond(T), pinv drift ||W E - I||_F and the Penrose
residuals. The rows go to the run directory's metrics.csv (the other columns NaN) and are judged against
the scenario's budgets as any run's are.

Without budgets of its own on them, a target scenario judges orthonormality, pinv_drift and penrose
against DEFAULT ceilings: what a correct implementation may commit in its dtype (validate's unit, TAU
times cond(T) u plus a length-D computation) at cond(T) up to DEFAULT_COND, on the normalisation validate
judges (the 2-norm of Z^T Z - I, ||W E - I||_F / sqrt(D)): a Frobenius norm of a D x D matrix is at most
sqrt(D) times those, so its ceiling is sqrt(D) times the threshold, and a module validate passes holds it.
A scenario may set any of them, tighter or looser, in its [budget] table.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from ...infra.rundir import METRIC_COLUMNS, csv_bytes, write_atomic
from ...numerics import metrics

DEFAULT_TIMEOUT = 300.0  # seconds the target's process may take, import and build included
DEFAULT_DTYPE = "float32"
TARGET_METRICS = ("orthonormality", "cond_T", "pinv_drift", "penrose", "penrose_1", "penrose_2", "penrose_3",
                  "penrose_4", "pinv_error")
DEFAULT_BUDGET_METRICS = ("orthonormality", "pinv_drift", "penrose")
DEFAULT_COND = 10.0  # the cond(T) the default ceilings allow for
ENTRY = "pitcheck.verbs.stress.target_worker"
# the RunConfig options that mean something for a module pitcheck does not build
TARGET_RUN_KEYS = ("steps", "vocab", "dim", "seed", "device", "adversary", "adversary_params", "optimizer", "lr",
                   "records_per_decade")
TARGET_KEYS = ("target", "dtype", "timeout")


FROBENIUS_METRICS = ("orthonormality", "pinv_drift")  # ||.||_F of a D x D matrix, validate's up to sqrt(D)


def default_limit(dtype: str, dim: int, metric: str = "penrose") -> float:
    """The default ceiling of a target scenario's `metric` (one of DEFAULT_BUDGET_METRICS): validate's
    threshold (TAU units of cond(T) (u + sqrt(D) min(u, u_fp32))) at cond(T) = DEFAULT_COND, times sqrt(D)
    for the Frobenius norms (FROBENIUS_METRICS)."""
    from ..validate.checks import TAU, Context
    from ..validate.dtypes import UNIT_ROUNDOFF

    threshold = TAU * Context(dtype, UNIT_ROUNDOFF[dtype], 2 * dim, dim).unit(DEFAULT_COND)
    return threshold * (dim ** 0.5 if metric in FROBENIUS_METRICS else 1.0)


def orthonormality_from_maps(E: np.ndarray, W: np.ndarray) -> float:
    """||Z^T Z - I||_F from the maps alone: W E is similar to Z^T Z (symmetric), so the Frobenius norm of
    Z^T Z - I is the root sum of squares of |eig(W E) - 1|."""
    ev = np.linalg.eigvals(W @ E)
    return float(np.sqrt(np.sum(np.abs(ev - 1.0) ** 2)))


def measure(E: np.ndarray, W: np.ndarray) -> dict:
    """The TARGET_METRICS of one state from its maps; NaN for what cannot be measured (non-finite maps)."""
    row = {m: float("nan") for m in TARGET_METRICS}
    if not (np.isfinite(E).all() and np.isfinite(W).all()):
        return row
    row["cond_T"] = min(metrics.condition_number(W), metrics.condition_number(E))
    row["orthonormality"] = orthonormality_from_maps(E, W)
    try:
        row.update({k: v for k, v in metrics.head_metrics(E, W.T).items() if k in TARGET_METRICS})
    except Exception:  # a map too large for float64's E^T B: the residuals stay NaN (they break a ceiling)
        row["pinv_drift"] = metrics.pinv_drift(E, W.T)
    return row


def request_of(scenario, threads: int | None = None) -> dict:
    """What the target's process is asked to do (target_worker.main reads it)."""
    from ...trajectory import recorded_steps

    c = scenario.config
    return {"target": scenario.target, "dtype": scenario.dtype, "device": c.device, "vocab": c.vocab, "dim": c.dim,
            "seed": c.seed, "steps": c.steps,
            "channels": [name.strip() for name in c.adversary.split(",") if name.strip()],
            "adversary_params": {k: getattr(c.adversary_params, k) for k in c.adversary_params.__dataclass_fields__},
            "optimizer": "" if scenario.own_optimizer else c.optimizer, "lr": c.lr,
            "recorded": recorded_steps(c.steps, c.records_per_decade), "threads": threads}


def run_target(scenario, out: Path | str, threads: int | None = None) -> tuple[list[dict], list[str], str]:
    """Step the scenario's target in its own process and measure each saved state: (rows, errors, fatal).
    `fatal` says why the target could not be imported, built or run to the end (a result exit status 2);
    `errors` what its own code raised while stepped (the states before are judged)."""
    from ..validate.isolation import child_death, run_entry, stderr_tail
    from ..validate.worker import read_phases
    from .target_worker import state_path

    out = Path(out)
    request = request_of(scenario, threads)

    def gather(tmp: Path, code, timed_out) -> tuple[list[dict], list[str], str]:
        rows = []
        for step in request["recorded"]:
            path = state_path(tmp, step)
            if not path.exists():
                break
            with np.load(path, allow_pickle=False) as data:
                rows.append({"step": step, **measure(data["E"], data["W"])})
        phases = read_phases(tmp / "phases.log")
        phase = phases[-1][1] if phases else "start-up"
        errors = [(tmp / "raised.txt").read_text().strip()] if (tmp / "raised.txt").exists() else []
        if timed_out:
            return rows, errors, f"target timed out after {scenario.timeout:g} s during {phase}"
        if (tmp / "fatal.txt").exists():
            return rows, errors, (tmp / "fatal.txt").read_text().strip()
        if code != 0 or phase != "finished":
            tail = stderr_tail(tmp)
            return rows, errors, f"target {child_death(code)} during {phase}" + (f" ({tail})" if tail else "")
        return rows, errors, ""

    rows, errors, fatal = run_entry(ENTRY, request, scenario.timeout, gather)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    full = [{k: r.get(k, float("nan")) for k in METRIC_COLUMNS} | {"step": r["step"]} for r in rows]
    write_atomic(out / "metrics.csv", csv_bytes(full))
    return rows, errors, fatal
