"""polar-ns stacked (model/retractions/polar.py stacked_polar_ns): every matrix of a stack follows its own Newton-Schulz
loop, to its own iteration count, and gives retract_polar_ns's result bit for bit or, where that raises,
a `failed` flag; whole cells run alone and batched write the same files."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from pitcheck.model import retractions as BR
from pitcheck.numerics.arrays import NumpyOps, TorchOps
from pitcheck.numerics.formats import FORMATS
from pitcheck.model.retractions import RetractionError, retract_polar_ns
from tests.trajectory.test_batched import alone_and_batched, four_cells

PRECISIONS = ["fp64", "fp32", "tf32", "bf16", "bf16-mixed"]


class Counting:
    """An Ops that counts its norm calls (one per iteration of retract_polar_ns) and keeps their values."""

    def __init__(self, base):
        self.base, self.calls, self.values = base, 0, []

    def __getattr__(self, name):
        return getattr(self.base, name)

    def norm(self, x):
        self.calls += 1
        self.values.append(self.base.norm(x))
        return self.values[-1]


def one_matrix(Z, xi, ops, errors=None):
    """retract_polar_ns on one matrix: (result or None where it raises, iterations it took)."""
    counting = Counting(ops)
    try:
        return retract_polar_ns(Z, xi, counting), counting.calls
    except RetractionError as exc:
        if errors is not None:
            errors.append(str(exc))
        return None, counting.calls


def singular_values_stack(V=24, D=4, seed=0):
    """Z + xi with chosen singular values: on the manifold, near it, farther (more iterations), slowly
    converging, too far (||Y^T Y - I||_F > 1), two stalling (not halving: no convergence), slowly converging."""
    rng = np.random.default_rng(seed)
    spectra = [np.ones(D), 1 + 1e-9 * np.arange(D), 1 + 1e-4 * np.arange(D), [1.3, 1.0, 0.9, 0.8],
               [1.5, 1.0, 1.0, 1.0], [0.55, 1.0, 1.1, 0.9], [1.0, 0.3, 1.0, 1.0], [1.2, 0.7, 1.1, 1.0]]
    Zs, xis = [], []
    for s in spectra:
        U, _ = np.linalg.qr(rng.standard_normal((V, D)))
        W, _ = np.linalg.qr(rng.standard_normal((D, D)))
        Z, _ = np.linalg.qr(rng.standard_normal((V, D)))
        Zs.append(Z)
        xis.append((U * np.asarray(s, dtype=np.float64)) @ W.T - Z)
    return np.stack(Zs), np.stack(xis)


OPS = {"numpy-fp64": lambda: NumpyOps(), "torch-fp32": lambda: TorchOps(),
       "torch-tf32": lambda: TorchOps(matmul_format=FORMATS["tf32"]),
       "torch-bf16-matmul": lambda: TorchOps(matmul_dtype=torch.bfloat16, native=False)}


def ops_and_stack(which: str):
    """The named Ops and singular_values_stack() in its library (torch float32 for the torch Ops)."""
    ops = OPS[which]()
    Z, xi = singular_values_stack()
    if ops.name == "torch":
        Z, xi = torch.from_numpy(Z).float(), torch.from_numpy(xi).float()
    return ops, Z, xi


@pytest.mark.parametrize("which", list(OPS))
def test_each_matrix_follows_its_own_loop_bit_for_bit_and_fails_where_it_raises(which):
    ops, Z, xi = ops_and_stack(which)
    errors = []
    expected = [one_matrix(Z[b], xi[b], ops, errors) for b in range(len(Z))]
    iterations = [n for _, n in expected]
    raises = [y is None for y, _ in expected]
    # the stack mixes iteration counts (2 to 8), and both of retract_polar_ns's raise conditions
    assert len(set(n for (y, n) in expected if y is not None)) >= 3, iterations
    assert raises == [False] * 4 + [True] * 3 + [False], iterations
    assert "too far" in errors[0] and all("did not converge" in e for e in errors[1:]), errors
    with torch.no_grad():
        Y, failed = BR.stacked_polar_ns(Z, xi, BR.StackedOps(ops))
    assert failed.dtype == bool and failed.tolist() == raises
    for b, (y, _) in enumerate(expected):
        if y is not None:
            got, want = (Y[b].numpy(), y.numpy()) if ops.name == "torch" else (Y[b], y)
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (which, b, iterations[b])


@pytest.mark.parametrize("which", ["numpy-fp64", "torch-fp32"])
def test_the_stack_takes_each_matrixs_own_norms_one_per_iteration(which):
    # ||G - I||_F of the matrix alone, the same Python floats: numpy's norm over the stack (axis=(-2, -1))
    # sums otherwise and differs in the last bit at most shapes, which a stopping test can turn into
    # another iteration count
    ops, Z, xi = ops_and_stack(which)
    alone = []
    for b in range(len(Z)):
        counting = Counting(ops)
        try:
            retract_polar_ns(Z[b], xi[b], counting)
        except RetractionError:
            pass
        alone += counting.values
    counting = Counting(ops)
    BR.stacked_polar_ns(Z, xi, BR.StackedOps(counting))
    assert counting.calls == len(alone) and sorted(counting.values) == sorted(alone)


def test_a_stack_that_all_converges_at_once_and_one_that_all_fails():
    ops = BR.StackedOps(NumpyOps())
    Z, xi = singular_values_stack()
    Y, failed = BR.stacked_polar_ns(Z[:2], 0 * xi[:2], ops)  # on the manifold: no step, nothing fails
    assert not failed.any()
    for b in range(2):
        assert Y[b].tobytes() == retract_polar_ns(Z[b], 0 * xi[b]).tobytes()
    _, failed = BR.stacked_polar_ns(Z[4:7], xi[4:7], ops)
    assert failed.tolist() == [True, True, True]


def test_polar_ns_is_registered_as_stacked():
    assert BR.STACKED_RETRACTIONS["polar-ns"] is BR.stacked_polar_ns


def iteration_recorder(monkeypatch):
    """Wrap the stacked polar-ns so each call also records every matrix's own iteration count (from the
    one-matrix loop on the same inputs); returns the list of per-call counts."""
    calls = []
    stacked = BR.stacked_polar_ns

    def recording(Z, xi, ops):
        calls.append([one_matrix(Z[b], xi[b], ops.base)[1] for b in range(Z.shape[0])])
        return stacked(Z, xi, ops)

    monkeypatch.setitem(BR.STACKED_RETRACTIONS, "polar-ns", recording)
    return calls


def check_batch(outcomes, files, steps: int) -> None:
    """Files byte-identical both ways; the stack computed steps of every cell, and a cell it computed fewer
    than all of was handed back at a failed polar-ns (its step redone and recorded by its own engine)."""
    assert all(o.batched_steps > 0 for o in outcomes), [o.batched_steps for o in outcomes]
    for o, (alone, batched) in zip(outcomes, files):
        assert alone == batched  # metrics.csv, checkpoint.npz, events.jsonl, manifest.json, commit.json
        if o.batched_steps < steps:
            assert b"retraction_failed" in batched["events.jsonl"] and b"polar-ns" in batched["events.jsonl"]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_batch_of_polar_ns_cells_writes_the_files_of_its_cells_run_alone(tmp_path, monkeypatch, precision):
    counts = iteration_recorder(monkeypatch)
    outcomes, files = alone_and_batched(four_cells(precision, "polar-ns"), tmp_path)
    check_batch(outcomes, files, 12)
    if precision != "bf16":  # bf16's products fail polar-ns in some steps of two cells (handed back)
        assert [o.batched_steps for o in outcomes] == [12] * 4  # the stack computed every step
    assert len(counts) >= 12
    # the cells of a stack needed different numbers of iterations in some step: each stopped on its own
    assert any(len(set(c)) > 1 for c in counts), counts


@pytest.mark.parametrize("vocab, dim, lrs", [(40, 6, (0.01, 0.1, 0.2, 0.02)), (24, 3, (0.15, 0.01, 0.05, 0.1))])
def test_odd_shapes_and_larger_steps_with_different_iteration_counts(tmp_path, monkeypatch, vocab, dim, lrs):
    # D = 6 and 3: D x D products below torch's own-loop threshold; larger learning rates give cells from
    # 3 to 9 iterations per step, and the largest lr's cell fails polar-ns at step 2 (handed back, then alone)
    counts = iteration_recorder(monkeypatch)
    cells = [replace(c, lr=lr) for c, lr in zip(four_cells("fp32", "polar-ns", vocab, dim, steps=12), lrs)]
    outcomes, files = alone_and_batched(cells, tmp_path)
    check_batch(outcomes, files, 12)
    assert sum(o.batched_steps for o in outcomes) >= 3 * 12
    assert any(o.batched_steps < 12 for o in outcomes)  # a stacked polar-ns failed a cell: handed back
    assert any(len(set(c)) > 1 for c in counts), counts
