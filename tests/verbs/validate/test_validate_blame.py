"""Who is blamed when a probe cannot finish: an exception the target's code raised is the target's; an
error in pitcheck's own probe code (its loss's backward, a factorisation) names the probe and the breach of
the target contract behind it; a non-finite gradient is reported at the step that produced it, not by
what it breaks later."""
import json
from pathlib import Path

import pytest
import torch

from pitcheck.verbs.validate import probes, worker
from pitcheck.verbs.validate.checks import Context, judge
from pitcheck.verbs.validate.dtypes import UNIT_ROUNDOFF
from tests.zoo._base import LLtPIT

V, D = 64, 4
CTX = Context("float32", UNIT_ROUNDOFF["float32"], V, D)


class CachedEmbeddingPIT(LLtPIT):
    """Serves embeddings from a table built once under no_grad: nothing flows back to Z or L from them."""

    def embed(self, ids):
        if not hasattr(self, "_table"):
            with torch.no_grad():
                self._table = self.solve(self.factor(), self.memory().T).T
        return self._table[self.check_ids(ids)].to(self.dtype)


class GraphOnceEmbeddingPIT(LLtPIT):
    """Caches the embedding table with its graph: the first backward through it works, the second cannot."""

    def embed(self, ids):
        if not hasattr(self, "_table"):
            self._table = self.solve(self.factor(), self.memory().T).T
        return self._table[self.check_ids(ids)].to(self.dtype)


class NanGradientPIT(LLtPIT):
    """A scale parameter at 0 entering as sqrt(s^2): the forward is fine, d/ds is 0/0 = NaN at once."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.s = torch.nn.Parameter(torch.zeros((), dtype=self.master))

    def factor(self):
        return super().factor() * (1 + torch.sqrt(self.s ** 2))


class RaisingPostStepPIT(LLtPIT):
    def post_step(self):
        raise RuntimeError("fused retraction kernel missing")


def run_check(cls, check, tmp_path):
    def make(vocab_size, hidden_size, *, dtype, device, seed):
        return cls(vocab_size, hidden_size, dtype=dtype, device=device, seed=seed)

    request = {"target": "t", "dtype": "float32", "device": "cpu", "vocab": V, "dim": D, "steps": 5, "seed": 0,
               "checks": [check], "conds": [100.0], "generic_cond": 10.0}
    worker.collect(make, request, tmp_path, worker.PhaseLog(tmp_path / "phases.log"))
    probe = probes.load_probe(tmp_path / f"{check}.npz")
    return probe.facts, judge(check, probe, CTX)


def test_an_embedding_without_a_gradient_path_is_the_breach_not_the_target_raising(tmp_path):
    # the spectrum drive's loss is the embedding's alone: its backward, pitcheck's code, raises
    facts, result = run_check(CachedEmbeddingPIT, "penrose", tmp_path)
    assert facts["by"] == "probe" and "probes.py" in facts["where"]
    assert result.verdict == "fail"
    assert not result.reason.startswith("the target raised")
    assert "embedding has no gradient path" in result.reason and "pitcheck's probe stopped" in result.reason


def test_a_cached_graph_is_named_when_the_second_backward_fails(tmp_path):
    facts, result = run_check(GraphOnceEmbeddingPIT, "penrose", tmp_path)
    assert result.verdict == "fail" and "second call" in result.reason and "embedding" in result.reason
    assert not result.reason.startswith("the target raised")


def test_a_nan_gradient_is_reported_at_the_first_step_not_by_what_it_breaks(tmp_path):
    facts, result = run_check(NanGradientPIT, "penrose", tmp_path)
    assert facts["by"] == "breach"
    assert result.verdict == "fail" and "non-finite gradient (nan)" in result.reason
    assert "parameter s " in result.reason and "own step 1" in result.reason


def test_an_exception_in_the_target_code_is_the_targets_with_its_own_line(tmp_path):
    facts, result = run_check(RaisingPostStepPIT, "penrose", tmp_path)
    assert facts["by"] == "target"
    assert result.reason.startswith("the target raised RuntimeError: fused retraction kernel missing")
    assert "test_validate_blame.py" in result.reason  # the target's frame, not torch's or pitcheck's


def test_a_probe_error_with_no_breach_found_is_an_error_naming_the_probe():
    probe = probes.Probe(facts={"error": "LinAlgError: singular", "where": "probes.py:10 (drive_spectrum)",
                                "by": "probe", "breach": ""})
    result = judge("penrose", probe, CTX)
    assert result.verdict == "error" and "pitcheck's probe stopped at probes.py:10" in result.reason
    breach = dict(probe.facts, breach="the target's logits has no gradient path to its parameters")
    result = judge("penrose", probes.Probe(facts=breach), CTX)
    assert result.verdict == "fail" and result.reason.startswith("the target's logits has no gradient path")
