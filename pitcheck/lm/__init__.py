"""Real training beside the adversaries: the `lm` gradient source.

A small causal language model (its own embedding and head are the run's: PIT's Z and T, or the tied or
untied tables of the baselines) trained on CPython's documentation text. The run's engine takes the
model's gradients for its interface and steps it under its precision policy and retraction, exactly as
it takes an adversary's; the body (positions, transformer blocks) is the source's own state, stepped by
its own Adam, checkpointed with the run. The float64 shadow runs its own body on the same token batches.

Only numpy is imported here: torch loads when a source is built.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..errors import PitcheckError
from ..gradients import register

NAME = "lm"
# what a recorded step of an lm run reports beside the interface metrics (nats per token)
LOSS_KEYS = ("train_loss", "heldout_loss", "shadow_heldout_loss")


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
            from .corpus import read_wordpiece, wordpiece_path

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


@register(NAME)
def _stateless_call(Z, L, rng, params, probe):
    """A small causal LM trained on CPython's documentation text (pitcheck.lm); its gradients need its
    body, so a run's engine asks its LMSource, never this function."""
    raise PitcheckError("the lm gradient source has state (its body and optimizer): it runs inside a run "
                        "(pitcheck run / compare / heads), not as a stateless gradient model")


def uses_lm(adversary: str) -> bool:
    return NAME in [n.strip() for n in str(adversary).split(",")]


def make_source(config, engine):
    """The LM source for one engine of a run (the model's, or its float64 shadow's)."""
    from .model import LMSource

    return LMSource(config, engine)


def teacher_fits(config, shape: tuple) -> bool:
    """Whether a teacher of this shape is a WordPiece model's full table, whose rows the run selects."""
    if config.lm.vocabulary == "bpe" or len(shape) != 2 or shape[1] != config.dim:
        return False
    from .corpus import read_wordpiece, wordpiece_path

    return shape[0] == len(read_wordpiece(wordpiece_path(config.lm.vocabulary)))


def teacher_rows(config, teacher):
    """The teacher's rows for the run's tokens: all of them for a table over the run's own vocabulary; the
    kept tokens' rows of a WordPiece model's full table."""
    if teacher.shape == (config.vocab, config.dim):
        return teacher
    from .corpus import load_corpus

    return teacher[list(load_corpus(config.vocab, config.lm.vocabulary).rows)]


def check_config(config) -> None:
    """What an lm run needs beyond a run's own checks; a one-line reason if not."""
    from .corpus import check_vocab

    check_vocab(config.vocab)
    config.lm.check()
    names = [n.strip() for n in config.adversary.split(",")]
    if "adaptive" in names:
        raise PitcheckError("the adaptive adversary probes trial steps of a stateless model: it cannot be "
                            "summed with lm")
