"""The registry of maps on the Stiefel manifold: one `Retraction` record per map, carrying all its forms.

A map is registered once, by its one-matrix form under `@register(...)`; its stacked form (B x V x D), if
it has one, is attached under `@stacked_form(name)` beside it in the same file; its distributed form is
named in the record (`sharded=`) and lives in pitcheck.model.sharded.retractions, which imports torch and
is loaded only by a sharded run. A second registration of a name, or a second stacked form, is refused.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass
from typing import Callable

from ...infra.errors import PitcheckError

# the module holding the distributed forms the records name (imported on demand: it imports torch)
SHARDED_MODULE = "pitcheck.model.sharded.retractions"


@dataclass(frozen=True)
class PlotStyle:
    """How a retraction is drawn in every figure: its line colour and its marker."""
    colour: str
    marker: str


@dataclass(frozen=True)
class Retraction:
    """One registered map: the one-matrix function (`fn`), how it is drawn, its place in tables and, for a
    map that does not land on the manifold, why it is only approximate (None for a retraction). `stacked`:
    its form over a B x V x D stack (None: its cells run alone); `sharded`: the name of its distributed form
    in pitcheck.model.sharded.retractions (None: no sharded run can use it)."""
    name: str
    fn: Callable
    style: PlotStyle
    table_order: int
    approximate: str | None = None
    stacked: Callable | None = None
    sharded: str | None = None

    @property
    def forms(self) -> frozenset[str]:
        """Which forms the map has, of single, stacked and sharded."""
        return frozenset(f for f, has in (("single", True), ("stacked", self.stacked is not None),
                                          ("sharded", self.sharded is not None)) if has)

    def sharded_form(self) -> Callable | None:
        """The distributed form (importing torch), or None."""
        return None if self.sharded is None else getattr(importlib.import_module(SHARDED_MODULE), self.sharded)


# name -> record, in registration order (the order error messages list the names in)
RECORDS: dict[str, Retraction] = {}
# name -> function, and name -> why it is approximate: views of RECORDS under the names callers use
RETRACTIONS: dict[str, Callable] = {}
# maps that are not retractions (they do not land on the manifold): run and benchmarked for comparison
APPROXIMATE: dict[str, str] = {}
# name -> stacked form; a retraction not named here runs its cells unbatched
STACKED_RETRACTIONS: dict[str, Callable] = {}


class RetractionError(PitcheckError):
    """A retraction could not produce a point (breakdown, no convergence); recorded as an event."""


def check_point(name: str, Z, xi, stacked: bool = False) -> None:
    """Z a V x D array with V >= D (stacked: B x V x D), xi of Z's shape; a PitcheckError naming the shape
    otherwise. With more columns than rows no matrix has orthonormal columns, and the maps would return
    something silently off the manifold. Reads shapes only: nothing added to a step's O(V D^2)."""
    shape = getattr(Z, "shape", None)
    rank = 3 if stacked else 2
    if shape is None or len(shape) != rank:
        got = f"a {' x '.join(map(str, shape))} array" if shape is not None else type(Z).__name__
        raise PitcheckError(f"{name}: Z must be a {'B x ' if stacked else ''}V x D array, got {got}")
    V, D = shape[-2], shape[-1]
    if V < D:
        raise PitcheckError(f"{name}: Z is {V} x {D}, more columns than rows: no V x D matrix has orthonormal "
                            "columns (need V >= D)")
    xi_shape = getattr(xi, "shape", None)
    if xi_shape is not None and len(xi_shape) and tuple(xi_shape) != tuple(shape):
        raise PitcheckError(f"{name}: xi is {' x '.join(map(str, xi_shape))}, Z {' x '.join(map(str, shape))}: "
                            "a step has Z's shape")


class CheckedMap:
    """A map behind check_point, once for every registered retraction (and stacked form) rather than in each.
    Its __defaults__ are the map's own, read and set through: a test plants a bug by setting them."""

    def __init__(self, name: str, fn: Callable, stacked: bool = False):
        functools.update_wrapper(self, fn)
        self.name, self.fn, self.stacked = name, fn, stacked

    def __call__(self, Z, xi, *args, **kwargs):
        check_point(self.name, Z, xi, self.stacked)
        return self.fn(Z, xi, *args, **kwargs)

    @property
    def __defaults__(self):
        return self.fn.__defaults__

    @__defaults__.setter
    def __defaults__(self, value):
        self.fn.__defaults__ = value

    def __reduce__(self):  # by name, as a function pickles (its module attribute is this wrapper)
        return _registered_map, (self.name,)


def _registered_map(name: str):
    return RETRACTIONS[name]


class StackedMap(CheckedMap):
    """A stacked form behind check_point's refusal of a shape with no orthonormal point, as every registered
    one-matrix map is; it pickles by name from STACKED_RETRACTIONS."""

    def __reduce__(self):
        return _stacked_map, (self.name,)


def _stacked_map(name: str):
    return STACKED_RETRACTIONS[name]


def register(name: str, colour: str, marker: str, table_order: int, approximate: str | None = None,
             sharded: str | None = None):
    """Register a one-matrix map as the record `name` (refused if the name is taken)."""
    def deco(fn):
        if name in RECORDS:
            raise PitcheckError(f"retraction {name!r} is registered twice")
        checked = CheckedMap(name, fn)
        RECORDS[name] = Retraction(name, checked, PlotStyle(colour, marker), table_order, approximate,
                                   sharded=sharded)
        RETRACTIONS[name] = checked
        if approximate is not None:
            APPROXIMATE[name] = approximate
        return checked

    return deco


def stacked_form(name: str):
    """Attach a stacked form to the registered map `name` (registered above it), wrapped as a StackedMap."""
    def deco(fn):
        record = RECORDS.get(name)
        if record is None:
            raise PitcheckError(f"stacked form of {name!r}: no map of that name is registered")
        if record.stacked is not None:
            raise PitcheckError(f"retraction {name!r} has a stacked form already")
        checked = StackedMap(name, fn, stacked=True)
        RECORDS[name] = dataclasses.replace(record, stacked=checked)
        STACKED_RETRACTIONS[name] = checked
        return checked

    return deco


def in_table_order(names) -> list[str]:
    """The registered names among `names`, in the order tables show them."""
    return sorted((n for n in names if n in RECORDS), key=lambda n: RECORDS[n].table_order)


def get_retraction(name: str) -> Callable:
    try:
        return RETRACTIONS[name]
    except KeyError:
        raise PitcheckError(f"unknown retraction {name!r}; choose from {', '.join(RETRACTIONS)}") from None

