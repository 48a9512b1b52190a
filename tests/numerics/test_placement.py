"""Placements (pitcheck.numerics.placement): 8- and 4-bit formats on PIT's tensors, in the engine, the metrics and the
floors. Each test fails if the placement's quantisation it covers is skipped (planted one-line bugs, each
seen red before this suite was trusted)."""
import numpy as np
import pytest

from pitcheck import PitcheckError
from pitcheck.model import heads
from pitcheck.model.engine import Engine, StepSettings
from pitcheck.numerics.placement import PLACEMENTS, get_placement, quantised_head, stored_copy, through
from pitcheck.numerics.policy import POLICIES, get_policy
from pitcheck.verbs.compare import storage_floor
from pitcheck.trajectory import RunConfig, run
from tests.helpers import orthonormal

pytest.importorskip("torch")

PLACED = [name for name, p in POLICIES.items() if p.placement]


def _engine(precision, V=256, D=32):
    engine = Engine("torch", get_policy(precision), StepSettings("qr", "adam", 1e-3), device="cpu")
    engine.initialise(orthonormal(V, D), np.eye(D))
    return engine


def _through_fp32(x, recipe):
    return np.asarray(through(np.asarray(x, dtype=np.float64), recipe)).astype(np.float32).astype(np.float64)


def _one_scale_values(x) -> bool:
    """x holds at most E4M3's 2 x 126 finite non-zero values times one scale (and zero)."""
    return len(np.unique(np.asarray(x))) <= 2 * 126 + 1


def test_every_placement_is_named_by_one_policy_and_old_manifests_are_unchanged():
    assert sorted(get_policy(n).placement_name for n in PLACED) == sorted(PLACEMENTS)
    fp32 = get_policy("fp32").describe()
    assert set(fp32) == {"name", "storage", "master", "factor", "matmul", "gradient", "loss_scaling", "u"}
    assert get_policy("fp8-store").describe()["placement"]["z_copy"] == "tensor-current"
    # errors are in units of the coarsest element format the maps pass through
    assert get_policy("nvfp4-store").u == 2.0**-2 and get_policy("fp8-logits").u == 2.0**-4
    assert get_policy("fp8-adam").u == get_policy("fp32").u
    with pytest.raises(PitcheckError, match="unknown placement"):
        get_placement("fp6")


@pytest.mark.parametrize("precision", PLACED)
def test_each_placed_policy_steps_and_measures(precision):
    engine = _engine(precision, V=128, D=32)
    for step in range(3):
        grads = engine.gradients(["gaussian"], seed=0, step=step, params=None)
        assert engine.step(grads, step) == []
    m = engine.interface()
    assert np.isfinite([m["orthonormality"], m["pinv_drift"], m["cond_T"]]).all()
    # the maps' unit: E4M3's or coarser where a recipe is on a map, fp32's where only the steps see one
    placed = engine.policy.placement
    assert engine.policy.u >= (2.0**-4 if placed.map_recipes() else POLICIES["fp32"].u)
    assert any("placement" in e for e in engine.emulated)


@pytest.mark.parametrize("precision", ["fp8-gathered-z", "fp8-store", "mxfp8-store", "nvfp4-store"])
def test_the_model_computes_with_the_quantised_copy_of_z(precision):
    engine = _engine(precision)
    Z, L = engine.stored()
    placement = engine.policy.placement
    master = engine.arrays.numpy(engine.master["Z"])
    assert not np.array_equal(Z, master)  # a copy was made ...
    assert np.array_equal(Z, _through_fp32(master, placement.z_copy))  # ... and it is the recipe's
    # orthonormality is measured on the copy: at the floor of the format, far above fp32's
    floor = storage_floor(precision, 256, 32)
    assert engine.interface()["orthonormality"] > 0.3 * floor > 1e3 * storage_floor("fp32", 256, 32)


def test_adam_moments_are_stored_in_fp8():
    engine = _engine("fp8-adam")
    plain = _engine("fp32")
    for e in (engine, plain):
        e.step(e.gradients(["gaussian"], seed=0, step=0, params=None), 0)
    recipe = engine.policy.placement.moments
    assert recipe == "tensor-current"
    for key in ("mZ", "vZ"):
        assert _one_scale_values(engine.arrays.numpy(engine.opt[key]))
        assert not _one_scale_values(plain.arrays.numpy(plain.opt[key]))


@pytest.mark.parametrize("precision", ["fp8-logits", "fp8-logits-block", "mxfp8-logits"])
def test_the_fp8_logits_gemm_shows_in_the_pinv_metrics_only(precision):
    placed, plain = _engine(precision), _engine("fp32")
    a, b = placed.interface(), plain.interface()
    assert a["orthonormality"] == b["orthonormality"]  # Z itself is untouched
    assert b["pinv_drift"] < 1e-5
    # W E - I of an FP8 head: of the order of E4M3's u = 2^-4 relative to ||I||_F = sqrt(D)
    assert 1e-3 < a["pinv_drift"] / np.sqrt(32) < 0.2


def test_quantised_head_orientation_on_exactly_representable_operands():
    # T = diag(1, 4, 16, 64) and Z with entries +-1/2: every scaled value is E4M3-exact (per-tensor scale
    # 448 / 64 = 7: 7, 28, 112, 448), so the FP8 head is Z T, oriented as logits = h T Z^T: exactly under MX's
    # power-of-two scales, to the fp32 rounding of TE's decode scale 1/7 per-tensor
    Z = np.zeros((8, 4))
    Z[np.arange(4), np.arange(4)] = 0.5
    Z[4 + np.arange(4), np.arange(4)] = -0.5
    L = np.diag([1.0, 2.0, 4.0, 8.0])
    exact = Z @ (L @ L.T)
    assert np.array_equal(quantised_head(Z, L, get_placement("logits-mxfp8")), exact)
    assert np.allclose(quantised_head(Z, L, get_placement("logits-tensor")), exact, rtol=4 * 2.0**-24, atol=0)
    # the activation operand is quantised too: with L[1, 0] = 1/8, T[1, 1] = 4 + 1/64 (x 7 = 28.11, between
    # E4M3's 28 and 30) is held as 4 in the head, which then gives 2 where the exact head gives 2.0078125
    L2 = L.copy()
    L2[1, 0] = 0.125
    B = quantised_head(Z, L2, get_placement("logits-tensor"))
    assert (Z @ (L2 @ L2.T))[1, 1] == 2.0078125 and abs(B[1, 1] - 2.0) < 1e-6


def test_blocks_run_along_the_rows_the_gemms_contraction_axis():
    # a 1.0 in every row's first entry sets each row's MX scale to 2^-8: entries of 1e-6 fall below E4M3's
    # smallest subnormal there and vanish; blocks down the columns would keep them (their own scale)
    x = np.full((32, 32), 1e-6)
    x[:, 0] = 1.0
    q = through(x, "mxfp8")
    assert np.array_equal(q[:, 0], x[:, 0]) and not q[:, 1:].any()


def test_stored_l_is_quantised_too():
    engine = _engine("fp8-store", V=128, D=32)
    for step in range(3):
        engine.step(engine.gradients(["gaussian"], seed=0, step=step, params=None), step)
    _, L = engine.stored()
    plain = _engine("fp32", V=128, D=32)
    for step in range(3):
        plain.step(plain.gradients(["gaussian"], seed=0, step=step, params=None), step)
    assert _one_scale_values(L) and not _one_scale_values(plain.stored()[1])


def test_floors_through_placements_are_ordered():
    fp32 = storage_floor("fp32", 256, 32)
    fp8, mx, nv = (storage_floor(p, 256, 32) for p in ("fp8-store", "mxfp8-store", "nvfp4-store"))
    assert storage_floor("fp8-logits", 256, 32) == fp32 == storage_floor("fp8-adam", 256, 32)
    assert storage_floor("fp8-gathered-z", 256, 32) == fp8
    assert 1e4 * fp32 < fp8 and fp8 < nv and mx < nv
    Q = orthonormal(64, 32)
    assert np.array_equal(stored_copy(Q, "fp64", None), Q)


def test_a_placed_run_resumes_with_identical_results(tmp_path, monkeypatch):
    from tests.trajectory.test_trajectory import _Interrupt

    cfg = RunConfig(backend="torch", precision="fp8-adam", vocab=64, dim=32, steps=40, optimizer="adam",
                    lr=1e-3, retraction="qr", device="cpu")
    run(cfg, tmp_path / "full")
    monkeypatch.setattr(heads, "gradient", _Interrupt(at=23))
    with pytest.raises(PitcheckError, match="interrupted at step 23"):
        run(cfg, tmp_path / "cut")
    run(cfg, tmp_path / "cut", resume=True)
    assert (tmp_path / "full" / "metrics.csv").read_bytes() == (tmp_path / "cut" / "metrics.csv").read_bytes()


def test_compare_report_ranks_the_placements_by_the_tie():
    """report.md's 'Placements ranked': each precision at its best retraction, by ||W E - I||_F; the tie holds
    within the drift bound, breaks beyond it, and a floor above 0.1 is inconclusive; no placement, no section."""
    from pitcheck.verbs.compare.report import placement_lines

    def row(precision, retraction, drift, bound, ortho, floor):
        return {"precision": precision, "retraction": retraction, "final_pinv_drift": drift, "drift_bound": bound,
                "final_orthonormality": ortho, "floor": floor}

    rows = [row("fp32", "qr", 1e-6, 2e-6, 1e-6, 7e-8), row("fp32", "cayley", 5e-6, 9e-6, 4e-6, 7e-8),
            row("fp8-logits", "qr", 0.14, 2e-6, 1e-6, 7e-8), row("fp8-logits", "cholqr2", 0.13, 2e-6, 1e-6, 7e-8),
            row("nvfp4-store", "qr", 0.31, 0.6, 0.29, 0.29)]
    lines = placement_lines(rows)
    table = [line for line in lines if line.startswith("| ") and line[2].isdigit()]
    assert [line.split(" | ")[1] for line in table] == ["fp32", "fp8-logits", "nvfp4-store"]
    assert table[0].endswith("| holds |") and "1.00e-06" in table[0]  # fp32 at qr, its best retraction
    assert "1.30e-01" in table[1] and table[1].endswith("| broken (6.5e+04x its bound) |")
    assert table[2].endswith("| inconclusive (floor > 0.1) |")
    assert placement_lines([row("fp32", "qr", 1e-6, 2e-6, 1e-6, 7e-8)]) == []
