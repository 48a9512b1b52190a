"""The lm source's options (a run's `lm` table) and its name; no torch."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ...infra.errors import PitcheckError
from .corpus import read_wordpiece, wordpiece_path

NAME = "lm"


@dataclass(frozen=True)
class LMParams:
    seq_len: int = 32  # tokens of context per sequence
    sequences: int = 16  # sequences per training batch
    layers: int = 1  # transformer blocks between the embedding and the head (0: none)
    body_lr: float = 3e-3  # Adam's learning rate for the body
    eval_sequences: int = 64  # sequences of training and of held-out text each recorded loss is the mean over
    # "bpe" (learned from the text) or "wordpiece:VOCAB.txt" (a pretrained model's, cut to the V most frequent
    # tokens: that model's embedding table, given as the teacher, has a row for each)
    vocabulary: str = "bpe"

    def check(self) -> None:
        for name, low, high in (("seq_len", 2, 1024), ("sequences", 1, 4096), ("layers", 0, 8),
                                ("eval_sequences", 1, 4096)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise PitcheckError(f"lm.{name} must be an integer in [{low}, {high}], got {value!r}")
        if not isinstance(self.vocabulary, str):
            raise PitcheckError(f"lm.vocabulary must be a string, got {self.vocabulary!r}")
        if self.vocabulary != "bpe":
            read_wordpiece(wordpiece_path(self.vocabulary))
        lr = self.body_lr
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (0 < lr < float("inf")):
            raise PitcheckError(f"lm.body_lr must be a positive finite number, got {lr!r}")

    def to_json(self) -> dict:
        return asdict(self)


def lm_params(value) -> LMParams:
    """LMParams from itself or a dict (a grid's [fixed.lm] table, a manifest); unknown keys refused."""
    if isinstance(value, LMParams):
        return value
    if not isinstance(value, dict):
        raise PitcheckError(f"lm options must be a table, got {value!r}")
    known = {f.name for f in fields(LMParams)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise PitcheckError(f"unknown lm option {unknown[0]!r}; lm takes {', '.join(sorted(known))}")
    return LMParams(**value)
