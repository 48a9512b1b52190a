"""Gradient sources with state of their own, registered by the adversary name they answer to.

The stateless gradient models (gradients.py) are functions of the stored model and (seed, step). A
stateful source (pitcheck.sources.lm: a language model's body and its optimizer) is built once for each engine
of a run and stepped with it; what a run needs to know of it beyond that goes through its
`StatefulSource` record here, so the run names no source.

The object a record builds for an engine (`build`) is the engine's `source`: `name`, `add_gradients(engine,
base, step)`, `advance()` / `discard()` (the body's step once the interface step is taken / skipped),
`losses(engine)` and `shadow_losses(engine)` (the columns a recorded row gains), `loss_columns(shadow)`,
`describe()` (its manifest entry), `snapshot()` / `restore()`, `state_dict()` / `load_state_dict()`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..infra.errors import PitcheckError


@dataclass(frozen=True)
class StatefulSource:
    name: str  # the adversary name that selects it
    config_field: str  # the RunConfig field holding its options (left out of a config that does not use it)
    options: Callable[[Any], Any]  # its options from themselves, a dict (a grid's table, a manifest) or None
    check_config: Callable[[Any], None]  # what a run with it needs beyond a run's own checks
    teacher_fits: Callable[[Any, tuple], bool]  # a teacher of another shape than V x D it takes rows of
    teacher_rows: Callable[[Any, Any], Any]  # the teacher's rows for the run's tokens
    # its input files by the manifest key of their SHA-256: (description, path or None where not used)
    input_files: dict[str, tuple[Callable[[Any], str], Callable[[Any], str | None]]]
    build: Callable[[Any, Any], Any]  # (config, engine) -> the engine's source


STATEFUL_SOURCES: dict[str, StatefulSource] = {}


def register_stateful(source: StatefulSource) -> StatefulSource:
    if source.name in STATEFUL_SOURCES:
        raise PitcheckError(f"stateful source {source.name!r} registered twice")
    STATEFUL_SOURCES[source.name] = source
    return source


def adversary_names(adversary: str) -> list[str]:
    return [n.strip() for n in str(adversary).split(",")]


def stateful_source(adversary: str) -> StatefulSource | None:
    """The stateful source an adversary names, or None."""
    names = adversary_names(adversary)
    return next((s for s in STATEFUL_SOURCES.values() if s.name in names), None)
