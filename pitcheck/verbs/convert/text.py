"""The text of the SmolLM2 study: the pydoc corpus (pitcheck.sources.lm.corpus's split) tokenised by SmolLM2's
own tokenizer; training batches that are a function of (seed, step) alone, the fixed held-out evaluation
windows, and the held-out calibration windows a scaled mode fits its logit scale on (none overlaps an
evaluation window). `config` is anything with seed, seq_len, sequences and eval_sequences."""
from __future__ import annotations

import functools

import numpy as np
import torch

from ...infra.errors import PitcheckError

BATCH_STREAM = 2**31 + 201  # apart from every other stream of the package
CALIBRATION_SEQUENCES = 16


@functools.lru_cache(maxsize=1)
def corpus_tokens() -> tuple[np.ndarray, np.ndarray]:
    """(training, held-out) token ids of the pydoc text, SmolLM2's tokenizer."""
    from ...sources.lm.corpus import split_text
    from ...sources.pretrained.body import smollm2_tokenizer

    tok = smollm2_tokenizer()
    return tuple(np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
                 for text in split_text())


def batch(tokens: np.ndarray, config, step: int) -> torch.Tensor:
    rng = np.random.default_rng([config.seed, step, BATCH_STREAM])
    starts = rng.integers(0, len(tokens) - config.seq_len - 1, size=config.sequences)
    return torch.from_numpy(np.stack([tokens[s:s + config.seq_len + 1] for s in starts]))


def _eval_starts(tokens: np.ndarray, seq_len: int, eval_sequences: int) -> np.ndarray:
    return np.linspace(0, len(tokens) - seq_len - 1, eval_sequences).astype(np.int64)


def heldout_windows(tokens: np.ndarray, config) -> torch.Tensor:
    starts = _eval_starts(tokens, config.seq_len, config.eval_sequences)
    return torch.from_numpy(np.stack([tokens[s:s + config.seq_len + 1] for s in starts]))


def calibration_windows(tokens: np.ndarray, seq_len: int, eval_sequences: int,
                        count: int = CALIBRATION_SEQUENCES) -> torch.Tensor:
    """`count` held-out windows, evenly spread, none overlapping an evaluation window: the text a scaled mode
    fits its logit scale on, so the held-out loss it is then judged by is not the loss it was fitted to."""
    width = seq_len + 1
    taken = _eval_starts(tokens, seq_len, eval_sequences)
    candidates = [int(s) for s in np.linspace(0, len(tokens) - width, 8 * count).astype(np.int64)
                  if np.all(np.abs(taken - s) >= width)]
    if len(candidates) < count:
        raise PitcheckError(f"the held-out text holds {len(candidates)} windows apart from the evaluation ones, "
                            f"not {count}")
    starts = [candidates[i] for i in np.linspace(0, len(candidates) - 1, count).round().astype(int)]
    return torch.from_numpy(np.stack([tokens[s:s + width] for s in starts]))
