"""keep-embedding-scaled's logit scale, fitted at conversion on SmolLM2's held-out text: the body's final
hidden states for the calibration windows (held-out, none an evaluation window) under the converted PIT head
in float32, its logits z = (h T) Z^T, and the s that minimises the mean cross-entropy of s z
(pitcheck.sources.pretrained.scale, a deterministic 1-D minimisation)."""
from __future__ import annotations

import torch

from ...sources.pretrained.conversion import Conversion


# the study's evaluation windows (scripts/studies/smollm2_study.py): the calibration windows avoid them
STUDY_SEQ_LEN, STUDY_EVAL_SEQUENCES = 32, 4


def calibration_logits(conv: Conversion, model, seq_len: int = STUDY_SEQ_LEN,
                       eval_sequences: int = STUDY_EVAL_SEQUENCES) -> tuple:
    """(z, targets): float64 logits of the unscaled PIT head (N x V) and the next tokens (N) on the
    calibration windows, with `model` as it is (untrained: call it before any step)."""
    from ...sources.pretrained.body import PITHead
    from .text import calibration_windows, corpus_tokens

    windows = calibration_windows(corpus_tokens()[1], seq_len, eval_sequences)
    head = PITHead(conv.Z, conv.L, "qr", torch.float32)
    inputs, targets = windows[:, :-1], windows[:, 1:]
    was_training = model.training
    model.eval()  # SmolLM2 has no dropout; eval() says so anyway
    try:
        with torch.no_grad():
            h = model.model(inputs_embeds=head.embed(inputs)).last_hidden_state
            z = head.logits(h.to(torch.float32))
    finally:
        model.train(was_training)
    return z.reshape(-1, z.shape[-1]).to(torch.float64).numpy(), targets.reshape(-1).numpy()


def fit_scale(conv: Conversion, model=None, seq_len: int = STUDY_SEQ_LEN,
              eval_sequences: int = STUDY_EVAL_SEQUENCES) -> dict:
    """{"scale", "loss", "loss_at_1", "slope", "tokens"}: the fitted logit scale and the calibration
    windows' loss at it and at s = 1 (nats/token)."""
    from ...sources.pretrained.body import load_smollm2
    from ...sources.pretrained.scale import fit_logit_scale

    z, targets = calibration_logits(conv, load_smollm2() if model is None else model, seq_len, eval_sequences)
    return {**fit_logit_scale(z, targets), "tokens": int(len(targets))}
