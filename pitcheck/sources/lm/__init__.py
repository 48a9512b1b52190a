"""Real training beside the adversaries: the `lm` gradient source.

A small causal language model (its own embedding and head are the run's: PIT's Z and T, or the tied or
untied tables of the baselines) trained on CPython's documentation text. The run's engine takes the
model's gradients for its interface and steps it under its precision policy and retraction, exactly as
it takes an adversary's; the body (positions, transformer blocks) is the source's own state, stepped by
its own Adam, checkpointed with the run. The float64 shadow runs its own body on the same token batches.

Only numpy is imported here: torch loads when a source is built. Importing this package registers the
source (stateful.STATEFUL_SOURCES) and its stateless stand-in (gradients.GRADIENT_MODELS) as `lm`.
"""
from __future__ import annotations

from ...infra.errors import PitcheckError
from ...model.gradients import register
from ..stateful import StatefulSource, adversary_names, register_stateful
from .corpus import check_vocab, load_corpus, read_wordpiece, wordpiece_path
from .params import NAME, LMParams, lm_params

__all__ = ["NAME", "LMParams", "lm_params", "uses_lm", "make_source", "teacher_fits", "teacher_rows",
           "check_config"]


@register(NAME)
def _stateless_call(Z, L, rng, params, probe):
    """A small causal LM trained on CPython's documentation text (pitcheck.sources.lm); its gradients need its
    body, so a run's engine asks its LMSource, never this function."""
    raise PitcheckError("the lm gradient source has state (its body and optimizer): it runs inside a run "
                        "(pitcheck run / compare / heads), not as a stateless gradient model")


def uses_lm(adversary: str) -> bool:
    return NAME in adversary_names(adversary)


def make_source(config, engine):
    """The LM source for one engine of a run (the model's, or its float64 shadow's)."""
    from .model import LMSource  # imports torch: only when an lm run is built

    return LMSource(config, engine)


def teacher_fits(config, shape: tuple) -> bool:
    """Whether a teacher of this shape is a WordPiece model's full table, whose rows the run selects."""
    if config.lm.vocabulary == "bpe" or len(shape) != 2 or shape[1] != config.dim:
        return False
    return shape[0] == len(read_wordpiece(wordpiece_path(config.lm.vocabulary)))


def teacher_rows(config, teacher):
    """The teacher's rows for the run's tokens: all of them for a table over the run's own vocabulary; the
    kept tokens' rows of a WordPiece model's full table."""
    if teacher.shape == (config.vocab, config.dim):
        return teacher
    return teacher[list(load_corpus(config.vocab, config.lm.vocabulary).rows)]


def check_config(config) -> None:
    """What an lm run needs beyond a run's own checks; a one-line reason if not."""
    check_vocab(config.vocab)
    config.lm.check()
    if "adaptive" in adversary_names(config.adversary):
        raise PitcheckError("the adaptive adversary probes trial steps of a stateless model: it cannot be "
                            "summed with lm")


def _wordpiece_file(config) -> str | None:
    return None if config.lm.vocabulary == "bpe" else config.lm.vocabulary.partition(":")[2]


register_stateful(StatefulSource(
    name=NAME, config_field="lm", options=lambda value: lm_params(LMParams() if value is None else value),
    check_config=check_config, teacher_fits=teacher_fits, teacher_rows=teacher_rows,
    input_files={"vocabulary_sha256": (lambda config: f"the WordPiece vocabulary {_wordpiece_file(config)}",
                                       _wordpiece_file)},
    build=make_source))
