"""The counter gradient stream (--gradient-stream counter): gaussian drawn from counter-based normals where the
run computes. Its draws against the independent numpy reference of the generator; the model and its float64
shadow stepped on the same draws; resume, seeds and an untied head's two streams; no V x D array to the host
on its way; the refusals of what it cannot draw."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pitcheck.infra.errors import PitcheckError  # noqa: E402
from pitcheck.model.amp import fits, magnitude_peaks  # noqa: E402
from pitcheck.model.gradients import counter_gradient, counter_key  # noqa: E402
from pitcheck.trajectory import RunConfig  # noqa: E402
from pitcheck.trajectory.loop import run  # noqa: E402
from pitcheck.trajectory.step import Lockstep  # noqa: E402
from tests import counter_normal_reference as reference  # noqa: E402

BASE = RunConfig(vocab=96, dim=6, steps=40, precision="fp32", backend="torch", device="cpu",
                 gradient_stream="counter")


def test_gaussian_draws_are_the_reference_generators_normals_scaled():
    GZ, GL = counter_gradient(["gaussian"], ((96, 6), (6, 6)), 7, 11, "cpu")
    assert GZ.dtype == torch.float64 and GZ.shape == (96, 6) and GL.shape == (6, 6)
    assert np.array_equal(GZ.numpy(), reference.normals((96, 6), 7, 11, counter_key(0, 0)) / math.sqrt(576))
    assert np.array_equal(GL.numpy(), reference.normals((6, 6), 7, 11, counter_key(0, 1)) / 6.0)
    # a sum's second component and an untied table's second stream draw their own keys
    keys = {counter_key(c, p, s) for c in range(3) for p in range(2) for s in range(2)}
    assert len(keys) == 12
    twice = counter_gradient(["gaussian", "gaussian"], ((96, 6), (6, 6)), 7, 11, "cpu")
    second = reference.normals((96, 6), 7, 11, counter_key(1, 0)) / math.sqrt(576)
    assert np.array_equal(twice[0].numpy(), GZ.numpy() + second)


def rows(out):
    import csv

    with open(out / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_the_shadow_steps_on_the_models_draws(tmp_path):
    # torch float64 against the numpy float64 shadow: on one stream they part only by rounding
    run(replace(BASE, precision="fp64"), tmp_path / "a", progress=False)
    distance = max(float(r["shadow_Z"]) for r in rows(tmp_path / "a"))
    assert distance < 1e-13
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["config"]["gradient_stream"] == "counter"
    assert "gradient_stream" not in replace(BASE, gradient_stream="numpy").to_json()


def test_a_run_on_the_counter_stream_is_reproducible_and_resumes_exactly(tmp_path):
    run(BASE, tmp_path / "full", progress=False)
    run(BASE, tmp_path / "again", progress=False)
    run(replace(BASE, steps=17), tmp_path / "cut", progress=False)
    run(BASE, tmp_path / "cut", resume=True, progress=False)
    run(replace(BASE, seed=1), tmp_path / "seed1", progress=False)
    with np.load(tmp_path / "full" / "checkpoint.npz") as a, np.load(tmp_path / "again" / "checkpoint.npz") as b, \
            np.load(tmp_path / "cut" / "checkpoint.npz") as c, np.load(tmp_path / "seed1" / "checkpoint.npz") as d:
        assert all(np.array_equal(a[k], b[k]) and np.array_equal(a[k], c[k]) for k in a.files)
        assert not np.array_equal(a["Z"], d["Z"])
    # and it is another stream than numpy's
    run(replace(BASE, gradient_stream="numpy"), tmp_path / "numpy", progress=False)
    with np.load(tmp_path / "full" / "checkpoint.npz") as a, np.load(tmp_path / "numpy" / "checkpoint.npz") as b:
        assert not np.array_equal(a["Z"], b["Z"])


def test_an_untied_heads_tables_draw_two_streams():
    pair = Lockstep(replace(BASE, head="untied", shadow=False))
    grads, _ = pair.gradients(["gaussian"], 3, None)
    assert set(grads) == {"E", "B"} and not torch.equal(grads["E"], grads["B"])
    assert np.array_equal(grads["B"].numpy(), reference.normals((96, 6), 0, 3, counter_key(0, 0, 1)) / math.sqrt(576))


def test_no_table_crosses_to_the_host_while_drawing_and_stepping(monkeypatch):
    pair = Lockstep(replace(BASE, shadow=False))
    engine = pair.engine
    moved = []
    real = type(engine.arrays.ops).to_numpy

    def watched(self, x):
        if x.numel() >= 96 * 6:
            moved.append(tuple(x.shape))
        return real(self, x)

    monkeypatch.setattr(type(engine.arrays.ops), "to_numpy", watched)
    for step in range(3):
        grads, _ = pair.gradients(["gaussian"], step, None)
        assert isinstance(grads["Z"], torch.Tensor)
        pair.step(grads, None, step)
    assert moved == []


def test_a_steps_gradient_peaks_cross_to_the_host_once_and_judge_as_the_scaled_arrays_do(monkeypatch):
    from pitcheck.model.amp import LossScaler, magnitude_peaks, peak_fits

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((40, 5)) * 10.0 ** rng.uniform(-3, 5), rng.standard_normal((5, 5)), np.zeros((0, 5))]
    crossings = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: crossings.append(self.shape) or real(self))
    peaks = magnitude_peaks([torch.from_numpy(a) for a in arrays])
    assert len(crossings) == 1 and peaks == magnitude_peaks(arrays) == [np.abs(a).max(initial=0.0) for a in arrays]
    nan = arrays[1].copy()
    nan[2, 3] = np.nan
    assert math.isnan(magnitude_peaks([torch.from_numpy(nan)])[0]) and math.isnan(magnitude_peaks([nan])[0])
    scaler = LossScaler(True)
    for fmt in ("fp16", "bf16", "fp32"):
        for a in arrays:
            for scale in (2.0**16, 3.0, 2.0**-3):
                scaler.scale = scale
                assert peak_fits(scaler.scaled_peak(magnitude_peaks([a])[0]), fmt) == fits(scaler.scaled(a), fmt)


def test_a_finite_check_of_arrays_and_tensors():
    assert all(map(math.isfinite, magnitude_peaks([np.ones(3), torch.ones(3)])))
    assert not math.isfinite(magnitude_peaks([torch.tensor([1.0, -math.inf])])[0])
    assert not math.isfinite(magnitude_peaks([np.array([math.nan])])[0])
    assert fits(torch.tensor([1.0, 6e4]), "fp16") and not fits(torch.tensor([1.0, 7e4]), "fp16")
    assert fits(np.array([6e4]), "fp16") and not fits(np.array([7e4]), "fp16")
    assert fits(torch.empty(0), "fp16")


@pytest.mark.parametrize("change, message", [
    ({"adversary": "dense_output"}, "dense_output has no counter form"),
    ({"adversary": "gaussian,spike"}, "spike has no counter form"),
    ({"gradient_stream": "philox"}, "unknown gradient stream 'philox'"),
    ({"seed": 2**32}, "--seed must be below 2\\^32 with --gradient-stream counter"),
    ({"shards": 2, "backend": "numpy", "precision": "fp64"}, "a sharded run draws --gradient-stream numpy"),
])
def test_what_the_counter_stream_cannot_draw_is_refused(change, message):
    with pytest.raises(PitcheckError, match=message):
        replace(BASE, **change).validate()
