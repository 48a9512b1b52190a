"""Planted bugs in the issue-20 retractions, one line each, and the guarding test that must go red.

Each case patches pitcheck.retractions (a coefficient, a constant, a function) the way a one-line bug
would change it, runs the guard from test_retractions, and asserts it fails; the unpatched guard
passing is checked by that file itself.
"""
import math

import numpy as np
import pytest

from pitcheck import retractions as R
from tests import test_retractions as guards


def _sign_fix_dropped(Z, xi, ops=None, oversample=R.RCQR_OVERSAMPLE):
    # rcqr without the sign fix of R1: a column whose sketch R has a negative diagonal flips sign
    ops = ops or R.ops_for(Z)
    Y = Z + xi
    k = max(Y.shape[1], math.ceil(oversample * Y.shape[1]))
    _, R1 = ops.qr(ops.matmul(R._gaussian_sketch(k, Y.shape[0], Y, ops), Y))
    Y1 = R._upper_inverse_right(Y, R1.T, ops)
    return R._upper_inverse_right(Y1, R._chol_gram(Y1, ops, "rcqr"), ops)


def _landing_attraction_at_y(Z, xi, ops=None, attraction=1.0, step=0.5):
    # landing with the attraction evaluated at Z + xi instead of Z (a different map: one Newton-Schulz step)
    Y = Z + xi
    return Y - attraction * step * Y @ (Y.T @ Y - np.eye(Y.shape[1]))


PLANTED = {
    "polar-express: two digits of one coefficient swapped": (
        lambda mp: mp.setattr(R, "POLAR_EXPRESS_COEFFICIENTS",
                              ((8.28721201814563, -23.595886519098837, 17.300387312530933),
                               (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
                               (3.9486908534822946, -2.980902115962949, 0.5518191394370137),
                               (3.3184196573706015, -2.488488024314874, 0.51004894012372),
                               (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
                               (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
                               (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
                               (1.875, -1.25, 0.375))),
        guards.test_polar_express_coefficients_are_the_papers_minimax_polynomials, ()),
    "polar-express: safety factor applied to the last polynomial too": (
        lambda mp: mp.setattr(R, "polar_express_schedule", lambda steps, safety=1.01: [
            (a / safety, b / safety**3, c / safety**5) for a, b, c in R.POLAR_EXPRESS_COEFFICIENTS][:steps]
            + [(1.875 / safety, -1.25 / safety**3, 0.375 / safety**5)] * max(0, steps - 8)),
        guards.test_polar_express_converges_with_enough_steps, ()),
    "gram-ns: restart skipped": (
        lambda mp: mp.setattr(R, "GRAM_NS_RESTARTS", ()),
        guards.test_gram_ns_is_the_polar_express_iteration_on_the_gram_matrix, ((2,),)),
    "gram-ns: restart skipped (half precision)": (
        lambda mp: mp.setattr(R.retract_gram_ns, "__defaults__", (5, ())),
        guards.test_gram_ns_restart_is_what_keeps_half_precision_stable, ()),
    "rcqr: sign fix of the sketch's R dropped": (
        lambda mp: mp.setitem(R.RETRACTIONS, "rcqr", _sign_fix_dropped),
        guards.test_qr_retractions_agree_on_a_generic_point, ("rcqr",)),
    "cholqr3-shifted: shift constant 11 -> 0 (plain cholqr3)": (
        lambda mp: mp.setattr(R, "SHIFTED_CHOLQR_CONSTANT", 0),
        guards.test_cholqr3_shifted_handles_what_breaks_cholqr2, ()),
    "landing: attraction evaluated at Z + xi": (
        lambda mp: mp.setitem(R.RETRACTIONS, "landing", _landing_attraction_at_y),
        guards.test_landing_agrees_with_the_euclidean_step_on_the_manifold, ()),
    "landing: attraction sign flipped": (
        lambda mp: mp.setattr(R, "LANDING_STEP", -0.5) or mp.setattr(
            R.retract_landing, "__defaults__", (1.0, -0.5)),
        guards.test_issue_20_names_are_registered_and_labelled, ()),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_is_caught(bug, monkeypatch):
    plant, guard, args = PLANTED[bug]
    plant(monkeypatch)
    with pytest.raises((AssertionError, pytest.fail.Exception, R.RetractionError)):  # red: fails or errors
        guard(*args)


def test_guards_pass_unplanted():
    for _, guard, args in PLANTED.values():
        guard(*args)
