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


# which forms each map has: a map registered without a stacked or sharded form shows up here
FORMS = {
    "none": {"single", "sharded"},
    "polar": {"single", "stacked", "sharded"},
    "polar-gram": {"single", "stacked", "sharded"},
    "polar-ns": {"single", "stacked", "sharded"},
    "qr": {"single", "stacked", "sharded"},
    "cholqr": {"single", "stacked", "sharded"},
    "cholqr2": {"single", "stacked", "sharded"},
    "ns5": {"single", "sharded"},
    "cayley": {"single", "stacked", "sharded"},
    "cayley-iter": {"single", "stacked"},
    "polar-express": {"single"},
    "gram-ns": {"single"},
    "rcqr": {"single"},
    "cholqr3-shifted": {"single"},
    "landing": {"single"},
}


def test_each_map_has_the_forms_listed():
    assert {name: set(r.forms) for name, r in R.RECORDS.items()} == FORMS
    # the stacked view is the records' stacked forms, each behind the shape check and named for its map
    assert R.STACKED_RETRACTIONS == {n: r.stacked for n, r in R.RECORDS.items() if r.stacked is not None}
    for name, form in R.STACKED_RETRACTIONS.items():
        assert isinstance(form, R.StackedMap) and form.name == name and form.stacked


def test_the_sharded_forms_are_the_ones_the_records_name():
    pytest.importorskip("torch")
    from pitcheck.model import sharded

    assert list(sharded.SHARDED_RETRACTIONS) == [n for n, r in R.RECORDS.items() if r.sharded]
    for name, form in sharded.SHARDED_RETRACTIONS.items():
        assert R.RECORDS[name].sharded_form() is form is sharded.get_sharded_retraction(name)
    assert R.RECORDS["landing"].sharded_form() is None


def test_the_registry_refuses_a_second_map_or_stacked_form_under_one_name():
    with pytest.raises(PitcheckError, match="'qr' is registered twice"):
        R.register("qr", "#000000", ".", table_order=99)(lambda Z, xi, ops=None: Z)
    with pytest.raises(PitcheckError, match="'qr' has a stacked form already"):
        R.stacked_form("qr")(lambda Z, xi, ops: Z)
    with pytest.raises(PitcheckError, match="'nope': no map of that name"):
        R.stacked_form("nope")(lambda Z, xi, ops: Z)
    assert "nope" not in R.RECORDS and R.RECORDS["qr"].fn is R.retract_qr
