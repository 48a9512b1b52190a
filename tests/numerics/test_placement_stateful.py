"""Stateful placements (pitcheck.numerics.quantisers): delayed scaling's amax histories and seeded stochastic rounding
in real runs. Each test fails on a planted one-line bug in the quantisers or the engine (the plants are
listed in results/fp8/STATEFUL.md)."""
import signal

import numpy as np
import pytest

from pitcheck import PitcheckError
from pitcheck.model import heads
from pitcheck.model.engine import Engine, StepSettings
from pitcheck.numerics.formats import FORMATS, round_to
from pitcheck.numerics.placement import Placement, get_placement, quantised_head
from pitcheck.numerics.policy import get_policy
from pitcheck.numerics.quantisers import LOGITS_ROLES, Quantisers, stochastic_rng
from pitcheck.numerics.scaling import TensorDelayed, get_recipe
from pitcheck.trajectory import RunConfig, run
from tests.helpers import orthonormal

pytest.importorskip("torch")

DELAYED = ["fp8-logits-delayed", "fp8-adam-delayed"]
STATEFUL = DELAYED + ["nvfp4-grad-sr"]


def _engine(precision, V=128, D=32, seed=0):
    engine = Engine("torch", get_policy(precision), StepSettings("qr", "adam", 1e-3), device="cpu", seed=seed)
    engine.initialise(orthonormal(V, D), np.eye(D))
    return engine


def _steps(engine, first, n):
    for step in range(first, first + n):
        assert engine.step(engine.gradients(["gaussian"], seed=0, step=step, params=None), step) == []


def _state(engine) -> dict:
    return {k: np.asarray(v).copy() for k, v in engine.state_dict().items()}


def _same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# ---- policies and placements ---------------------------------------------------------------------------
def test_the_new_policies_name_their_recipes_options_and_rounding():
    delayed = get_policy("fp8-logits-delayed").describe()["placement"]
    assert delayed["logits"] == {"activation": "tensor-delayed", "weight": "tensor-delayed"}
    assert delayed["recipe_options"] == {"history_len": 16, "algo": "max"}
    assert get_policy("fp8-adam-delayed").describe()["placement"]["moments"] == "tensor-delayed"
    sr, rne = (get_policy(n).describe()["placement"] for n in ("nvfp4-grad-sr", "nvfp4-grad"))
    assert sr["gradients"] == rne["gradients"] == "nvfp4"
    assert sr["stochastic_rounding"] == ["gradients"] and "stochastic_rounding" not in rne
    # the logits GEMM is a map: its E4M3 sets the unit; gradients and moments reach the maps only through steps
    assert get_policy("fp8-logits-delayed").u == 2.0**-4
    assert get_policy("nvfp4-grad-sr").u == get_policy("fp8-adam-delayed").u == FORMATS["fp32"].u


def test_unsupported_stateful_placements_are_refused_in_one_line():
    with pytest.raises(PitcheckError, match="stochastic rounding is supported on its gradients only"):
        Placement("x", "", moments="nvfp4", stochastic=("moments",))
    with pytest.raises(PitcheckError, match="not supported"):
        Quantisers(Placement("x", "", z_copy="tensor-delayed"))
    # every placement, stateless ones too: the ranks step the plain policy, so a sharded fp8-logits run
    # would record a placement it never applied (Adam, whose moments fp8-adam places: under SGD, which keeps
    # none, that placement is refused first, sharded or not)
    for precision in ("nvfp4-grad-sr", "fp8-logits", "fp8-store", "fp8-adam"):
        with pytest.raises(PitcheckError, match="applies no placement .* runs unsharded"):
            RunConfig(precision=precision, backend="torch", device="cpu", vocab=64, dim=4, shards=2,
                      retraction="cholqr2", optimizer="adam").validate()


# ---- delayed scaling ------------------------------------------------------------------------------------
def test_each_moment_tensor_has_its_own_delayed_recipe():
    engine = _engine("fp8-adam-delayed")
    recipes = engine.quantisers.stateful()
    assert sorted(recipes) == ["mL", "mZ", "vL", "vZ"]
    assert len({id(r) for r in recipes.values()}) == 4
    _steps(engine, 0, 20)
    for key, recipe in recipes.items():
        assert len(recipe.history) == 16  # the window is full after 20 steps, and holds 16
        # the newest entry is the amax of the moment just computed; the scale is TE's fmax / max(history)
        assert recipe.scale == np.float32(448.0 / max(recipe.history))
    # m and v have different magnitudes: one shared history would give them one scale
    assert recipes["mZ"].scale != recipes["vZ"].scale and recipes["mZ"].scale != recipes["mL"].scale


def test_delayed_moments_are_cast_with_the_previous_scale():
    engine = _engine("fp8-adam-delayed")
    _steps(engine, 0, 5)
    before = engine.quantisers.stateful()["vZ"].scale
    _steps(engine, 5, 1)
    v = engine.arrays.numpy(engine.opt["vZ"])
    # every stored value is an E4M3 value times the decode scale of the step before (fp32(1 / scale)), held in
    # fp32 (the factor format): within fp32's rounding of an E4M3 value
    codes = v / float(np.float32(1.0 / before))
    assert np.allclose(round_to(codes, FORMATS["fp8-e4m3"]), codes, rtol=2.0**-23, atol=0)
    assert np.abs(codes).max() <= 448 * (1 + 2.0**-23)
    # the scale has moved on since (v grew): a cast with the new scale would not give these codes
    assert engine.quantisers.stateful()["vZ"].scale != before


def test_the_logits_histories_advance_once_per_step_and_never_when_measured():
    engine = _engine("fp8-logits-delayed")
    recipes = engine.quantisers.recipes
    first = engine.interface()
    assert all(len(recipes[r].history) == 0 and recipes[r].scale == 1.0 for r in LOGITS_ROLES)
    _steps(engine, 0, 3)
    # Z's amaxes are in; the L's wait where they are stored until something reads them (the checkpoint's state)
    assert len(recipes["logits_weight"].history) == 3 and len(engine.quantisers.pending) == 3
    state = _state(engine)
    assert [len(recipes[r].history) for r in LOGITS_ROLES] == [3, 3] and not engine.quantisers.pending
    again = [engine.interface() for _ in range(4)]
    assert _same_state(state, _state(engine))  # measuring changed nothing ...
    assert all(a["pinv_drift"] == again[0]["pinv_drift"] for a in again)  # ... and gives one answer
    # it is the head of the current scales: the newest entries are amax(T) and amax(Z) of the stored model
    Z, L = engine.stored()
    assert recipes["logits_weight"].history[0] != 0 and first["pinv_drift"] != again[0]["pinv_drift"]
    current = tuple(TensorDelayed(scale=recipes[r].scale) for r in LOGITS_ROLES)
    assert np.array_equal(engine.quantisers.logits_head(Z, L),
                          quantised_head(Z, L, get_placement("logits-delayed"), current))


def test_the_forward_logits_keeps_of_each_cast_only_what_a_history_keeps(monkeypatch):
    """A step's forward logits GEMM: a delayed recipe's history and scale as its full cast leaves them (the
    operand's amax), and Z read where it is stored; a stateless recipe leaves nothing, so nothing is cast."""
    import torch

    delayed, cast = _engine("fp8-logits-delayed"), _engine("fp8-logits-delayed")
    for engine in (delayed, cast):  # L away from I, where amax(L L^T) = amax(L)
        _steps(engine, 0, 2)
    L = delayed.stored()[1]
    assert np.abs(L @ L.T).max() != np.abs(L).max()
    reads = []
    numpy = torch.Tensor.numpy
    monkeypatch.setattr(torch.Tensor, "numpy", lambda t, *a, **k: reads.append(tuple(t.shape)) or numpy(t, *a, **k))
    delayed.quantisers.forward_logits(delayed.model.Z, delayed.arrays.numpy(delayed.model.L))
    assert max(map(np.prod, reads)) <= 32 * 32  # L's 32 x 32 only, never Z's 128 x 32 (or its transpose)
    monkeypatch.undo()
    Z, L = cast.stored()
    cast.quantisers.recipes["logits_activation"].quantise(L @ L.T)
    cast.quantisers.recipes["logits_weight"].quantise(Z)
    for role in LOGITS_ROLES:
        got, want = delayed.quantisers.recipes[role], cast.quantisers.recipes[role]
        # the device's entries (0-d float64 tensors) as floats: the same bits
        assert [float(a) for a in got.history] == want.history and float(got.scale) == want.scale
        assert got.history[0] > 0
    # Z's amax stays where Z is (T's is formed on the host from L)
    assert delayed.quantisers.recipes["logits_weight"].scale.dtype == torch.float64
    stateless = _engine("fp8-logits")
    monkeypatch.setattr(TensorDelayed, "observe", lambda *a: pytest.fail("a stateless recipe observed"))
    for recipe in stateless.quantisers.recipes.values():
        monkeypatch.setattr(recipe, "quantise", lambda *a, **k: pytest.fail("a cast whose result is dropped"))
    stateless.quantisers.forward_logits(stateless.model.Z, stateless.arrays.numpy(stateless.model.L))
    # and a step of it does not call the forward at all (its L would be one read of the device a step)
    monkeypatch.setattr(Quantisers, "forward_logits", lambda *a: pytest.fail("a forward with nothing to move"))
    _steps(stateless, 0, 1)


def test_a_torch_models_forward_L_waits_where_it_is_and_is_observed_in_step_order(monkeypatch):
    """The activation amax is of T = L L^T formed on the host: a torch model's L's wait on the device and are read
    in one transfer every PENDING_FORWARDS steps (or by a record or a checkpoint), giving the histories and
    scales of a host that formed each step's T at once."""
    import torch

    from pitcheck.numerics.quantisers import PENDING_FORWARDS

    engine = _engine("fp8-logits-delayed")
    eager = Quantisers(get_placement("logits-delayed"))
    reads = []
    numpy = torch.Tensor.numpy
    monkeypatch.setattr(torch.Tensor, "numpy", lambda t, *a, **k: reads.append(tuple(t.shape)) or numpy(t, *a, **k))
    steps = PENDING_FORWARDS + 8
    for step in range(steps):
        Z, L = (numpy(x.detach().double()) for x in (engine.model.Z, engine.model.L))
        eager.forward_logits(Z, L)
        _steps(engine, step, 1)
    monkeypatch.undo()
    assert [r for r in reads if len(r) == 3] == [(PENDING_FORWARDS, 32, 32)]  # one read of the waiting L's
    assert len(engine.quantisers.pending) == steps - PENDING_FORWARDS
    assert _same_state(eager.state_dict(), engine.quantisers.state_dict())  # the rest observed by the checkpoint


def test_snapshot_restore_and_state_dict_carry_the_histories():
    engine = _engine("fp8-adam-delayed")
    _steps(engine, 0, 4)
    snap, saved = engine.snapshot(), _state(engine)
    _steps(engine, 4, 3)
    after = _state(engine)
    engine.restore(snap)
    assert _same_state(saved, _state(engine))
    fresh = _engine("fp8-adam-delayed")
    fresh.load_state_dict(saved)
    assert _same_state(saved, _state(fresh))
    _steps(fresh, 4, 3)
    assert _same_state(after, _state(fresh))


def test_recording_more_or_less_often_leaves_the_run_unchanged(tmp_path):
    # 12 steps with a 16-step window: a measurement that advanced a history would leave more entries in it
    runs = {}
    for per_decade in (10, 2):
        cfg = RunConfig(backend="torch", precision="fp8-logits-delayed", vocab=64, dim=32, steps=12, optimizer="adam",
                        lr=1e-3, retraction="qr", device="cpu", records_per_decade=per_decade)
        rows = run(cfg, tmp_path / str(per_decade))
        runs[per_decade] = ({r["step"]: r for r in rows}, dict(np.load(tmp_path / str(per_decade) / "checkpoint.npz")))
    (often, ck_often), (rarely, ck_rarely) = runs[10], runs[2]
    assert len(often) > len(rarely)
    assert _same_state(ck_often, ck_rarely)
    for step, row in rarely.items():
        assert row["pinv_drift"] == often[step]["pinv_drift"]


@pytest.mark.parametrize("precision", STATEFUL)
def test_an_interrupted_stateful_run_resumes_with_identical_results(tmp_path, monkeypatch, precision):
    from tests.trajectory.test_trajectory import _Interrupt

    cfg = RunConfig(backend="torch", precision=precision, vocab=64, dim=32, steps=40, optimizer="adam",
                    lr=1e-3, retraction="qr", device="cpu", seed=3)
    run(cfg, tmp_path / "full")
    monkeypatch.setattr(heads, "gradient", _Interrupt(at=23))
    with pytest.raises(PitcheckError, match="interrupted at step 23"):
        run(cfg, tmp_path / "cut")
    run(cfg, tmp_path / "cut", resume=True)
    for name in ("metrics.csv", "checkpoint.npz"):
        assert (tmp_path / "full" / name).read_bytes() == (tmp_path / "cut" / name).read_bytes()


# one SIGKILL in the default suite (the in-process resume tests cover both policies); both with --runslow
@pytest.mark.parametrize("precision", [DELAYED[0], *(pytest.param(p, marks=pytest.mark.slow) for p in DELAYED[1:])])
def test_sigkilled_delayed_run_resumes_byte_identical(tmp_path, precision):
    from tests.hostile.test_kills import assert_same_run, kill_and_resume

    argv = ["run", "--precision", precision, "--device", "cpu", "--vocab", "256", "--dim", "32", "--steps", "400",
            "--optimizer", "adam", "--retraction", "qr", "--adversary", "gaussian", "--no-progress", "--no-shadow"]
    counts = kill_and_resume(argv, tmp_path / "cut", 2, signal.SIGKILL, 5, ["--resume"], assert_same_run)
    assert counts["chains_checked"] >= 1


# ---- stochastic rounding --------------------------------------------------------------------------------
def _block_of_point_three():
    """A gradient whose NVFP4 blocks each hold a 1 (the block's scale: 1 -> E2M1's 6) and fifteen 0.3s,
    which fall between E2M1's 1.5 and 2 (0.3 x 6 = 1.8): nearest always gives 2, stochastic 2 w.p. 0.6."""
    x = np.full((64, 32), 0.3)
    x[:, ::16] = 1.0
    return x


def test_stochastic_rounding_of_the_gradients_is_unbiased():
    quantisers = Quantisers(get_placement("grad-nvfp4-sr"), seed=7)
    nearest = Quantisers(get_placement("grad-nvfp4"), seed=7)
    x = _block_of_point_three()
    mask = x == 0.3
    draws = np.stack([quantisers.gradients({"Z": x}, step)["Z"][mask] for step in range(50)])
    levels = np.unique(draws)
    assert len(levels) == 2  # the two neighbours of 0.3 at the block's scale, nothing else
    # each draw is a Bernoulli choice between them: standard deviation at most gap / 2, so the mean of N
    # independent draws lies within 5 gap / (2 sqrt(N)) of 0.3 but for a chance below 1e-6
    bound = 5 * (levels[1] - levels[0]) / 2 / np.sqrt(draws.size)
    assert abs(draws.mean() - 0.3) < bound
    assert 0.5 < np.mean(draws == levels[1]) < 0.7  # rounds up with probability 0.6
    rne = nearest.gradients({"Z": x}, 0)["Z"][mask]
    assert np.all(rne == levels[1]) and abs(rne.mean() - 0.3) > 20 * bound  # nearest is biased


def test_stochastic_noise_is_keyed_by_seed_step_and_tensor():
    q = Quantisers(get_placement("grad-nvfp4-sr"), seed=7)
    x = _block_of_point_three()
    a = q.gradients({"Z": x, "L": x}, 3)
    assert all(np.array_equal(a[k], q.gradients({"Z": x, "L": x}, 3)[k]) for k in a)  # the same numbers again
    assert not np.array_equal(a["Z"], a["L"])  # each tensor its own stream
    assert not np.array_equal(a["Z"], q.gradients({"Z": x, "L": x}, 4)["Z"])  # each step its own
    other = Quantisers(get_placement("grad-nvfp4-sr"), seed=8)
    assert not np.array_equal(a["Z"], other.gradients({"Z": x, "L": x}, 3)["Z"])  # each seed its own
    # the key is (seed, step, index), nothing hidden: the stream can be rebuilt from it
    expect = get_recipe("nvfp4").fake_quant(x, rounding="stochastic", rng=stochastic_rng(7, 3, 1))
    assert np.array_equal(a["Z"], expect)


def test_stochastic_and_nearest_runs_differ_and_each_repeats():
    sr, sr_again, rne = _engine("nvfp4-grad-sr", seed=1), _engine("nvfp4-grad-sr", seed=1), _engine("nvfp4-grad")
    for e in (sr, sr_again, rne):
        _steps(e, 0, 3)
    assert _same_state(_state(sr), _state(sr_again))
    assert not np.array_equal(sr.arrays.numpy(sr.master["Z"]), rne.arrays.numpy(rne.master["Z"]))
    reseeded = _engine("nvfp4-grad-sr", seed=2)
    _steps(reseeded, 0, 3)
    assert not np.array_equal(sr.arrays.numpy(sr.master["Z"]), reseeded.arrays.numpy(reseeded.master["Z"]))
