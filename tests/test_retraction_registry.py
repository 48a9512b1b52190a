"""pitcheck.model.retractions' registry: one record per map (function, plot style, table order, approximate or not),
and the views callers use (RETRACTIONS, APPROXIMATE, get_retraction) agreeing with it."""
from __future__ import annotations

import matplotlib.colors
import matplotlib.markers
import pytest

from pitcheck.model import retractions as R
from pitcheck.infra.errors import PitcheckError


def test_the_views_are_the_records():
    assert list(R.RETRACTIONS) == list(R.RECORDS)  # registration order: the order messages list names in
    for name, record in R.RECORDS.items():
        assert record.name == name
        assert R.RETRACTIONS[name] is record.fn is R.get_retraction(name)
    assert R.APPROXIMATE == {n: r.approximate for n, r in R.RECORDS.items() if r.approximate is not None}
    with pytest.raises(PitcheckError, match="unknown retraction 'nope'; choose from none, polar,"):
        R.get_retraction("nope")


def test_the_approximate_maps_are_listed_with_a_reason():
    assert list(R.APPROXIMATE) == ["ns5", "polar-express", "gram-ns", "landing"]
    assert all(reason.strip() for reason in R.APPROXIMATE.values())
    assert R.APPROXIMATE["ns5"].startswith("Muon's 5 quintic Newton-Schulz steps")
    # the Q-factor and polar maps land on the manifold: none of them is approximate
    assert not {"qr", "cholqr", "cholqr2", "cholqr3-shifted", "rcqr", "polar", "polar-gram", "polar-ns"} & set(
        R.APPROXIMATE)


def test_every_retraction_has_its_own_style():
    styles = [r.style for r in R.RECORDS.values()]
    for s in styles:
        assert matplotlib.colors.is_color_like(s.colour) and s.colour.startswith("#")
        assert s.marker in matplotlib.markers.MarkerStyle.markers
    # no two maps share a colour or a marker: qr and cholqr2 were drawn alike before cholqr2 had one
    assert len({s.colour for s in styles}) == len(styles)
    assert len({s.marker for s in styles}) == len(styles)
    assert R.RECORDS["cholqr2"].style != R.RECORDS["qr"].style
    # the established ones keep the colours and markers of the committed figures
    assert R.RECORDS["qr"].style == R.PlotStyle("#1f77b4", "o")
    assert R.RECORDS["cayley"].style == R.PlotStyle("#d62728", "P")
    assert R.RECORDS["none"].style == R.PlotStyle("#7f7f7f", "x")


def test_table_order():
    # each map has its own place, 0..n-1
    assert sorted(r.table_order for r in R.RECORDS.values()) == list(range(len(R.RECORDS)))
    # the bench table's order: cheapest factorisations first, then the rest alphabetically
    assert R.in_table_order(R.RECORDS) == [
        "polar-gram", "polar-ns", "cholqr", "cholqr2", "qr", "polar", "cayley", "cayley-iter", "ns5",
        "cholqr3-shifted", "gram-ns", "landing", "none", "polar-express", "rcqr"]
    # names not registered (a benchmark's peers) are left to the caller
    assert R.in_table_order(["qr", "geotorch", "cholqr"]) == ["cholqr", "qr"]
