"""Draws kept from one batch to the next (pitcheck.model.draw_memo): the same gradient bytes whether the draws were
made now or kept, never another cell's, step's or shape's draws, and nothing kept past the budget."""
from __future__ import annotations

import numpy as np
import pytest

from pitcheck.model import draw_memo
from pitcheck.model.draw_memo import DrawMemo
from pitcheck.model.gradients import AdversaryParams, gradient
from pitcheck.numerics.reference import random_memory
from pitcheck.model.stacked_gradients import stacked_gradients

LM = ["dense_output", "sparse_input"]


@pytest.fixture
def memo(monkeypatch):
    fresh = DrawMemo()
    monkeypatch.setattr(draw_memo, "MEMO", fresh)
    monkeypatch.setattr("pitcheck.model.stacked_gradients.MEMO", fresh)
    return fresh


def state(V: int = 64, D: int = 8, k: int = 2):
    rng = np.random.default_rng(5)
    Z = np.stack([random_memory(V, D, rng) for _ in range(k)])
    L = np.stack([np.eye(D) + 0.05 * np.tril(rng.standard_normal((D, D))) for _ in range(k)])
    return Z, L


def per_cell(cells, Z, L, step):
    return [gradient(names, Z[k], L[k], seed, step, params) for k, (names, seed, params) in enumerate(cells)]


def assert_same(stacked, alone):
    for k, (gz, gl) in enumerate(alone):
        assert stacked[0][k].tobytes() == gz.tobytes() and stacked[1][k].tobytes() == gl.tobytes()


def test_kept_draws_give_the_bytes_of_draws_made_now(memo):
    Z, L = state()
    cells = [(["gaussian"], 0, AdversaryParams()), (LM, 1, AdversaryParams())]
    first = stacked_gradients(cells, Z, L, 7)
    assert len(memo.kept) == 3 and memo.nbytes > 0  # one gaussian stream, two of the mix
    again = stacked_gradients(cells, Z, L, 7)  # every draw looked up
    assert_same(first, per_cell(cells, Z, L, 7))
    assert_same(again, per_cell(cells, Z, L, 7))


@pytest.mark.parametrize("change", ["seed", "step", "shape", "params"])
def test_a_kept_draw_is_never_another_cells(memo, change):
    # the memo holds seed 0's draws at step 7 (64 x 8, batch 32); each change must draw its own
    Z, L = state()
    stacked_gradients([(LM, 0, AdversaryParams())], Z[:1], L[:1], 7)
    seed, step, params = 0, 7, AdversaryParams()
    if change == "seed":
        seed = 1
    elif change == "step":
        step = 8
    elif change == "shape":
        Z = Z[:, :48].copy()  # V = 48: zipf ids over another vocabulary
    else:
        params = AdversaryParams(batch=16)
    cells = [(LM, seed, params)]
    assert_same(stacked_gradients(cells, Z[:1], L[:1], step), per_cell(cells, Z[:1], L[:1], step))


def test_nothing_is_kept_past_the_budget_and_the_bytes_do_not_change(memo):
    memo.budget = 0
    Z, L = state()
    cells = [(LM, 3, AdversaryParams()), (["gaussian"], 4, AdversaryParams())]
    assert_same(stacked_gradients(cells, Z, L, 2), per_cell(cells, Z, L, 2))
    assert memo.kept == {} and memo.nbytes == 0


def test_kept_draws_cannot_be_written():
    memo = DrawMemo()
    drawn = (np.zeros(3), np.arange(2))
    memo.put(("gaussian", 0, 0, 0, 1, 1, AdversaryParams()), drawn)
    with pytest.raises(ValueError):
        drawn[0][0] = 1.0


def test_one_model_named_twice_keeps_two_streams(memo):
    # "gaussian,gaussian" draws from streams 0 and 1: the same model and seed, two keys
    Z, L = state()
    cells = [(["gaussian", "gaussian"], 0, AdversaryParams())]
    assert_same(stacked_gradients(cells, Z[:1], L[:1], 3), per_cell(cells, Z[:1], L[:1], 3))
    assert len(memo.kept) == 2


def test_a_draw_that_fills_the_budget_exactly_is_kept():
    drawn = (np.zeros(4), np.zeros(4))
    memo = DrawMemo(budget=64)
    memo.put(("a",), drawn)
    assert memo.nbytes == 64 and ("a",) in memo.kept
    memo.put(("b",), (np.zeros(1),))  # one byte more than the budget: made, not kept
    assert ("b",) not in memo.kept and memo.nbytes == 64
