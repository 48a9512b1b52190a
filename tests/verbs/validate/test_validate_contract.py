"""`contract` judges the precision a target computes in from computed values, not from values it stores:
correct float64 modules whose maps at initialisation are exact float32 (a Hadamard memory with entries
+-2^-k, the identity memory, an embedding drawn as float32 Gaussians), T = I there, pass; float32 solves
under a float64 request still fail."""
import importlib

import numpy as np
import pytest
import torch

from pitcheck.model.gradients import AdversaryParams
from pitcheck.verbs.validate import probes
from pitcheck.verbs.validate.checks import Context, judge
from pitcheck.verbs.validate.dtypes import UNIT_ROUNDOFF
from pitcheck.verbs.validate.target import build

V, D = 128, 8


def contract(name, dtype="float64"):
    module = build(importlib.import_module(f"tests.zoo.{name}").make, V, D, dtype, "cpu", 0)
    harness = probes.Harness(module, V, D, getattr(torch, dtype), "cpu", 0)
    probe = probes.probe_contract(harness, generic_cond=10.0)
    return probe, judge("contract", probe, Context(dtype, UNIT_ROUNDOFF[dtype], V, D))


@pytest.mark.parametrize("name", ["correct_hadamard", "correct_eye_memory", "correct_free_embedding"])
def test_a_float64_module_whose_initial_maps_are_exact_float32_passes(name, dtype="float64"):
    probe, result = contract(name)
    init = probe.arrays["E:init"]
    # the case exists: its embedding at initialisation is all exact float32 values
    assert (torch.from_numpy(init).float().double().numpy() == init).all()
    assert result.verdict == "pass", result.reason


@pytest.mark.parametrize("name", ["correct_hadamard", "correct_eye_memory"])
def test_a_float32_module_whose_initial_maps_are_exact_bfloat16_passes(name):
    assert contract(name, "float32")[1].verdict == "pass"


def test_float32_solves_under_a_float64_request_still_fail():
    _, result = contract("broken_fp32_solves")
    assert result.verdict == "fail" and "generic: 100% of the embedding entries are exact float32" in result.reason


@pytest.mark.parametrize("params,scales", [
    (None, {1.0, AdversaryParams().spike_scale}),  # the gradient models' defaults
    (AdversaryParams(spike_probability=1.0, spike_scale=7.0), {7.0}),
    (AdversaryParams(spike_probability=0.0, batch=3), {1.0}),
])
def test_the_trajectory_adversary_takes_the_gradient_models_parameters(params, scales):
    module = build(importlib.import_module("tests.zoo.correct_cayley").make, V, D, "float64", "cpu", 0)
    harness = probes.Harness(module, V, D, torch.float64, "cpu", 0)
    extra = {} if params is None else {"params": params}
    loss, scale = probes.adversary_loss(harness, 0, np.random.default_rng(0), **extra)
    assert scale in scales and torch.isfinite(loss)
