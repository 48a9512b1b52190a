"""The torch backend: every precision policy on CPU, the float64 shadow, fp16 loss scaling, CUDA paths."""
import json

import numpy as np
import pytest
import torch

from pitcheck import PitcheckError
from pitcheck.numerics.formats import round_to
from pitcheck.model.gradients import AdversaryParams
from pitcheck.numerics.policy import POLICIES, get_policy
from pitcheck.infra.rundir import read_events
from pitcheck.trajectory import RunConfig, run

CUDA = torch.cuda.is_available()


def _cfg(**kw):
    base = dict(backend="torch", vocab=256, dim=16, steps=60, device="cpu", optimizer="adam", lr=1e-2)
    base.update(kw)
    return RunConfig(**base)


@pytest.mark.parametrize("retraction", ["qr", "polar", "cayley"])
def test_fp64_torch_follows_the_numpy_trajectory(tmp_path, retraction):
    # the shadow is the numpy reference on the same gradient stream
    rows = run(_cfg(precision="fp64", retraction=retraction, steps=100, vocab=512, dim=16,
                    adversary="gaussian,dense_output"), tmp_path)
    assert rows[-1]["shadow_Z"] < 1e-9 and rows[-1]["shadow_T"] < 1e-9


def test_shadow_distance_detects_a_different_trajectory(tmp_path):
    # the same check must fail when the two runs do differ: bf16 storage is far from float64
    rows = run(_cfg(precision="bf16", retraction="qr"), tmp_path)
    assert rows[-1]["shadow_Z"] > 1e-4


@pytest.mark.parametrize("precision", list(POLICIES))
def test_every_policy_runs_on_cpu_and_says_where_things_live(tmp_path, precision):
    rows = run(_cfg(precision=precision, retraction="qr", adversary="gaussian,sparse_input"), tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    policy = get_policy(precision)
    assert manifest["policy"]["storage"] == policy.storage and manifest["device"] == "cpu"
    if policy.matmul in ("tf32", "bf16", "fp16"):
        assert any(policy.matmul in note for note in manifest["emulated"])
    with np.load(tmp_path / "checkpoint.npz") as ck:
        Z, L, master = ck["Z"], ck["L"], ck["engine_master_Z"]
    # what the model computes with really is in its storage format
    assert np.array_equal(round_to(Z, policy.storage), Z) and np.array_equal(round_to(L, policy.storage), L)
    if policy.mixed:
        assert not np.array_equal(round_to(master, policy.storage), master)  # fp32 master copy
    assert all(np.isfinite(r["orthonormality"]) for r in rows)
    # a projective retraction keeps Z at the storage format's floor: a few u * sqrt(D)
    assert rows[-1]["orthonormality"] < 30 * policy.u * 16


@pytest.mark.parametrize("precision,low,high", [("bf16", 1e-3, 1e-2), ("fp16", 1e-4, 2e-3), ("fp32", 1e-8, 1e-6)])
def test_storage_floor_shows_from_step_zero(tmp_path, precision, low, high):
    rows = run(_cfg(precision=precision, steps=0, vocab=2048, dim=64), tmp_path)
    assert low < rows[0]["orthonormality"] < high


def test_fp16_overflow_is_recorded_skipped_and_the_loss_scale_backs_off(tmp_path):
    spikes = AdversaryParams(spike_scale=1e4, spike_probability=0.05)  # 1e4 x 2^16 overflows fp16
    cfg = _cfg(precision="fp16", adversary="gaussian,spike", steps=300, adversary_params=spikes)
    rows = run(cfg, tmp_path)
    overflow = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "gradient_overflow"]
    assert overflow and all("loss scale halved" in e["action"] for e in overflow)
    assert rows[-1]["loss_scale"] < 2.0**16
    assert np.isfinite(rows[-1]["orthonormality"])


def test_bf16_without_loss_scaling_takes_the_same_spikes(tmp_path):
    cfg = _cfg(precision="bf16", adversary="gaussian,spike", steps=100)
    run(cfg, tmp_path)
    assert not [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "gradient_overflow"]


def test_unknown_precision_and_missing_cuda_are_clear_errors(tmp_path):
    with pytest.raises(PitcheckError, match="unknown precision"):
        run(_cfg(precision="fp12"), tmp_path / "a")
    if not CUDA:
        with pytest.raises(PitcheckError, match="no CUDA device"):
            run(_cfg(device="cuda"), tmp_path / "b")


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("precision", ["tf32", "bf16", "fp16-mixed"])
def test_cuda_runs_natively(tmp_path, precision):
    # 4096 x 16: the smallest Z that 'auto' puts on a GPU (GPU_MIN_ELEMENTS)
    rows = run(_cfg(precision=precision, device="auto", vocab=4096), tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["device"].startswith("cuda") and manifest["emulated"] == []
    assert np.isfinite(rows[-1]["pinv_drift"])


def test_auto_puts_only_a_large_torch_run_on_a_gpu(monkeypatch):
    from pitcheck.trajectory import GPU_MIN_ELEMENTS, run_device
    from pitcheck.trajectory.step import shadow_engine_placement

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    small, large = _cfg(device="auto", vocab=128, dim=8), _cfg(device="auto", vocab=GPU_MIN_ELEMENTS // 16, dim=16)
    assert run_device(small) == "cpu" and run_device(large) == "cuda"
    assert run_device(_cfg(device="auto", vocab=GPU_MIN_ELEMENTS // 16 - 1, dim=16)) == "cpu"
    assert shadow_engine_placement(small.resolve()) == ("numpy", "cpu") and shadow_engine_placement(large.resolve()) == ("torch", "cuda")
    assert run_device(_cfg(device="cuda:1", vocab=128, dim=8)) == "cuda:1"  # asked for: kept, however small
    assert run_device(_cfg(device="cpu", vocab=8192, dim=128)) == "cpu"
    assert run_device(RunConfig(precision="fp64", vocab=8192, dim=128)) == "cpu"  # the numpy reference
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run_device(large) == "cpu"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_finiteness_check_sees_one_bad_entry_anywhere(dtype):
    from pitcheck.numerics.arrays import NumpyOps, TorchOps

    ops = TorchOps()
    x = torch.randn(37, 5).to(dtype)
    x[0, 0] = torch.finfo(dtype).max  # finite, however large
    x[-1, -1] = -torch.finfo(dtype).max
    assert ops.isfinite_all(x) and NumpyOps().isfinite_all(x.double().numpy())
    assert ops.isfinite_all(torch.empty(0, 5, dtype=dtype))
    for bad in (float("nan"), float("inf"), float("-inf")):
        for where in ((0, 0), (17, 2), (36, 4)):
            y = x.clone()
            y[where] = bad
            assert not ops.isfinite_all(y), (bad, where)
            assert not NumpyOps().isfinite_all(y.double().numpy())



@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_finiteness_check_on_views_and_tensors_that_require_grad(dtype):
    """The CPU check reads the tensor's memory through numpy (bfloat16 through torch): a strided view sees only
    its own entries, and a leaf that requires grad is read, not refused."""
    from pitcheck.numerics.arrays import TorchOps

    ops = TorchOps()
    x = torch.randn(16, 6).to(dtype)
    x[3, 5] = float("nan")
    assert not ops.isfinite_all(x.T) and not ops.isfinite_all(x[::3, 1:])
    assert ops.isfinite_all(x[:, :5]) and ops.isfinite_all(x[4:, ::2].T)
    w = torch.randn(4, 4, dtype=dtype, requires_grad=True)
    assert ops.isfinite_all(w)
