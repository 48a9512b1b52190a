"""A failed cell must not cost the other cells of its stack their batching.

Before this was tested, one cell of the default grid's language-model mix (seed 2, stuck from step 573,
its gradients overflowing float32 at every step) made every `cholqr` stack raise: its float64 shadow
took the gradient the model had refused, its Gram overflowed, and the singular factor made the stack's
triangular solve raise for every cell. A raising stack hands every cell back, so after 32 such steps
all six cells went on alone for the rest of their 10^4 steps. Here: a stacked retraction reports a
failed matrix in its mask and leaves the others' bits alone, a shadow skips the cells its model failed,
and a stack that raises counts as failing only the cells whose step alone had an event.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from pitcheck.numerics.arrays import NumpyOps, TorchOps
from pitcheck.model.batched_engine import StackedPit
from pitcheck.model.retractions import STACKED_RETRACTIONS, StackedOps
from pitcheck.model.engine import Engine, StepSettings
from pitcheck.model.gradients import AdversaryParams
from pitcheck.numerics.policy import get_policy
from pitcheck.numerics.reference import random_memory
from pitcheck.trajectory import RunConfig

from tests.trajectory.test_batched import alone_and_batched

OPS = {"numpy": (lambda: StackedOps(NumpyOps()), lambda a: a),
       "torch": (lambda: StackedOps(TorchOps()), torch.from_numpy)}
# the middle cell's xi: Y = 0 (a singular Gram), an overflowing Y (an infinite Gram), Y of rank 1
BAD_STEPS = {"zero": lambda Z: -Z, "overflowing": lambda Z: np.full_like(Z, np.sqrt(np.finfo(Z.dtype).max)),
             "rank-one": lambda Z: (np.outer(np.ones(Z.shape[0]), np.arange(1.0, Z.shape[1] + 1)) - Z).astype(Z.dtype)}
# the cases whose middle matrix each retraction must report failed (a singular factor, an infinite Gram,
# a singular Cayley system): the others may succeed or give non-finite numbers, which the engine's
# finiteness check fails
MUST_FAIL = {("cholqr", "zero"), ("cholqr", "rank-one"), ("cholqr2", "zero"), ("cholqr2", "rank-one"),
             ("polar-gram", "zero"),
             ("polar-gram", "overflowing"), ("polar-gram", "rank-one")}


def as_numpy(x):
    return x.numpy() if isinstance(x, torch.Tensor) else x


@pytest.mark.parametrize("bad", sorted(BAD_STEPS))
@pytest.mark.parametrize("ops_name", sorted(OPS))
@pytest.mark.parametrize("retraction", sorted(STACKED_RETRACTIONS))
def test_a_failed_matrix_is_reported_and_leaves_the_others_bits(retraction, ops_name, bad):
    make_ops, convert = OPS[ops_name]
    # the default grid's shape, and a random step for the healthy cells: with Y a multiple of an orthonormal Z
    # the factor is nearly diagonal and a solve rounds alike in both memory layouts of it (a row-major
    # replacement survived that test), here it does not (a replaced factor must keep LAPACK's layout)
    Z = np.stack([random_memory(128, 8, np.random.default_rng(k)) for k in range(3)])
    if ops_name == "torch":
        Z = Z.astype(np.float32)
    step = 0.02 * np.random.default_rng(7).standard_normal(Z[0].shape).astype(Z.dtype)
    xi = np.stack([step, BAD_STEPS[bad](Z[1]), -step])
    retract = STACKED_RETRACTIONS[retraction]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the bad cell's own arithmetic
        out, failed = retract(convert(Z), convert(xi), make_ops())
    healthy, healthy_failed = retract(convert(Z[[0, 2]]), convert(xi[[0, 2]]), make_ops())
    assert not failed[[0, 2]].any() and not healthy_failed.any()
    assert np.array_equal(as_numpy(out)[[0, 2]], as_numpy(healthy))
    if (retraction, bad) in MUST_FAIL:
        assert failed[1]


def test_a_singular_cayley_system_is_reported_not_raised():
    # I - V^T U / 2 singular for the middle cell: torch's solve raises for the stack, numpy's too; the stack
    # reports it (torch: solve_ex's info; numpy: matrix by matrix)
    ops = StackedOps(NumpyOps())
    a = np.stack([np.eye(3), np.zeros((3, 3)), 2 * np.eye(3)])
    b = np.ones((3, 3, 2))
    x, failed = ops.solve(a, b)
    assert failed.tolist() == [False, True, False] and np.array_equal(x[2], np.full((3, 2), 0.5))
    x, failed = StackedOps(TorchOps()).solve(torch.from_numpy(a), torch.from_numpy(b))
    assert failed.tolist() == [False, True, False] and np.array_equal(x[2].numpy(), np.full((3, 2), 0.5))


def shadow_engine(seed: int) -> Engine:
    e = Engine("numpy", get_policy("fp64"), StepSettings("cholqr", "sgd", lr=0.01))
    e.initialise(random_memory(16, 4, np.random.default_rng(seed)), np.eye(4))
    return e


def test_a_shadow_skips_the_cells_its_model_failed():
    # the skipped cell's gradient would overflow its Gram: without the skip, the stack's solve would raise
    G = np.stack([np.random.default_rng(1).standard_normal((16, 4)), np.full((16, 4), 1e200)])
    GL = np.zeros((2, 4, 4))
    stack = StackedPit([shadow_engine(0), shadow_engine(1)])
    failed = stack.step(G, GL, skip=np.array([False, True]))
    assert failed.tolist() == [False, True]
    alone = StackedPit([shadow_engine(0)])
    assert not alone.step(G[:1], GL[:1]).any()
    assert np.array_equal(stack.master["Z"][0], alone.master["Z"][0])


def grid_cells(precision: str, retraction: str, steps: int) -> list[RunConfig]:
    """The default grid's six cells of one class: 128 x 8, {gaussian, the language-model mix} x 3 seeds."""
    return [RunConfig(precision=precision, retraction=retraction, vocab=128, dim=8, steps=steps, seed=seed,
                      adversary=adversary, records_per_decade=1, device="cpu")
            for adversary in ("gaussian", "dense_output,sparse_input") for seed in range(3)]


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_the_default_grids_stuck_cell_leaves_its_cholqr_stack_batched(tmp_path, precision):
    # seed 2 of the mix goes wrong at step 573 (fp64: its factor's Gram overflows and the run breaks down;
    # fp32: its gradients overflow at every step and it goes on alone); the other five stay in the stack
    # past 573 + ALONE_AFTER_FAILURES to the end
    steps = 640
    outcomes, files = alone_and_batched(grid_cells(precision, "cholqr", steps), tmp_path)
    assert [o.batched_steps for o in outcomes[:5]] == [steps] * 5
    assert outcomes[5].batched_steps < 600
    assert all(a == b for a, b in files)


def raise_in_the_models_stack(monkeypatch, times: int) -> dict:
    """The model's stack raises at its first `times` steps (a failure of its own: no cell's step alone fails);
    the returned dict counts down the raises left."""
    raising = {"left": times}
    real_step = StackedPit.step

    def step(self, GZ, GL, skip=None):
        if raising["left"] > 0 and skip is None:
            raising["left"] -= 1
            raise np.linalg.LinAlgError("planted")
        return real_step(self, GZ, GL, skip)

    monkeypatch.setattr(StackedPit, "step", step)
    return raising


def two_runs_and_one_nonfinite_at_every_step(tmp_path):
    """Two clean fp32 qr runs and one whose gradients are non-finite at every step (each of its steps alone
    has an event), alone and batched: alone_and_batched's outcomes and files."""
    base = dict(precision="fp32", retraction="qr", vocab=32, dim=4, steps=30, records_per_decade=2)
    configs = [RunConfig(seed=0, **base), RunConfig(seed=1, **base),
               RunConfig(seed=2, adversary="nonfinite", adversary_params=AdversaryParams(nonfinite_probability=1.0),
                         **base)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return alone_and_batched(configs, tmp_path)


def test_a_stack_that_raises_sends_alone_only_the_cells_that_fail_alone(tmp_path, monkeypatch):
    monkeypatch.setattr("pitcheck.trajectory.batched.ALONE_AFTER_FAILURES", 4)
    raise_in_the_models_stack(monkeypatch, 3)
    outcomes, files = two_runs_and_one_nonfinite_at_every_step(tmp_path)
    assert [o.batched_steps for o in outcomes] == [27, 27, 0]
    assert all(a == b for a, b in files)


def test_a_run_that_makes_the_stack_raise_goes_alone_and_the_others_stay(tmp_path, monkeypatch):
    # the model's stack raises whenever a cell's gradients are non-finite (a stack failure one run causes):
    # that run has an event at every step alone, so it is blamed and leaves after ALONE_AFTER_FAILURES steps;
    # the others, with no event alone, are not counted as failing and stay in the stack
    monkeypatch.setattr("pitcheck.trajectory.batched.ALONE_AFTER_FAILURES", 4)
    real_step = StackedPit.step

    def step(self, GZ, GL, skip=None):
        if skip is None and not np.isfinite(GZ).all():
            raise np.linalg.LinAlgError("planted")
        return real_step(self, GZ, GL, skip)

    monkeypatch.setattr(StackedPit, "step", step)
    outcomes, files = two_runs_and_one_nonfinite_at_every_step(tmp_path)
    assert [o.batched_steps for o in outcomes] == [26, 26, 0]
    assert all(a == b for a, b in files)


def test_a_stack_that_keeps_raising_sends_every_cell_alone(tmp_path, monkeypatch):
    # no cell's step alone fails, so none is to blame: after ALONE_AFTER_FAILURES raising steps in a row the
    # stack gives up rather than raise and hand back every cell at every step
    monkeypatch.setattr("pitcheck.trajectory.batched.ALONE_AFTER_FAILURES", 4)
    raising = raise_in_the_models_stack(monkeypatch, 10**9)
    base = dict(precision="fp32", retraction="qr", vocab=32, dim=4, steps=30, records_per_decade=2)
    outcomes, files = alone_and_batched([RunConfig(seed=0, **base), RunConfig(seed=1, **base)], tmp_path)
    assert [o.batched_steps for o in outcomes] == [0, 0] and all(o.error is None for o in outcomes)
    assert 10**9 - raising["left"] == 4  # the stack stepped four times, then the two went on alone
    assert all(a == b for a, b in files)


def test_the_runs_shadow_stack_is_told_which_cells_the_model_failed(tmp_path, monkeypatch):
    calls = []
    real_step = StackedPit.step

    def step(self, GZ, GL, skip=None):
        failed = real_step(self, GZ, GL, skip)
        calls.append((None if skip is None else skip.copy(), failed.copy()))
        return failed

    monkeypatch.setattr(StackedPit, "step", step)
    base = dict(precision="fp32", retraction="cholqr", vocab=32, dim=4, steps=20, records_per_decade=1)
    configs = [RunConfig(seed=0, **base),
               RunConfig(seed=1, adversary="nonfinite", adversary_params=AdversaryParams(nonfinite_probability=0.3),
                         **base)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        alone_and_batched(configs, tmp_path)
    models, shadows = calls[0::2], calls[1::2]
    assert all(m[0] is None for m in models) and len(models) == len(shadows)
    assert all(np.array_equal(s[0], m[1]) for m, s in zip(models, shadows))
    assert any(m[1].any() for m in models)  # the model failed a cell, and its shadow was told
