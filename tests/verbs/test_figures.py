"""Figures: every precision and every retraction drawn in a colour and marker of its own; `pitcheck plot`'s
labels, legend, --dpi and --format."""
import argparse

import pytest

from pitcheck.model.retractions import RECORDS
from pitcheck.numerics.policy import POLICIES, PRECISION_STYLES, precision_style


def test_every_precision_has_a_style_and_no_two_collide():
    assert set(POLICIES) <= set(PRECISION_STYLES), set(POLICIES) - set(PRECISION_STYLES)
    styles = [(precision_style(p).colour, precision_style(p).marker) for p in POLICIES]
    assert len(set(styles)) == len(styles)
    colours = [c for c, _ in styles]
    assert len(set(colours)) == len(colours)  # told apart by colour alone too


def test_no_two_retractions_share_colour_and_marker():
    styles = [(r.style.colour, r.style.marker) for r in RECORDS.values()]
    assert len(set(styles)) == len(styles)


def test_a_precision_without_a_style_is_drawn_plainly_not_in_anothers_colour():
    assert precision_style("no-such") not in PRECISION_STYLES.values()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from pitcheck.trajectory import RunConfig, run

    out = tmp_path_factory.mktemp("runs") / "qr-fp64"
    run(RunConfig(backend="numpy", precision="fp64", steps=10, vocab=32, dim=4), out, progress=False)
    return out


def _plot_args(*argv):
    from pitcheck.cli import plot

    parser = argparse.ArgumentParser()
    plot.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["plot", *argv])


def test_plot_takes_dpi_and_format(tmp_path, run_dir):
    from pitcheck.cli import plot

    low, high = tmp_path / "low.png", tmp_path / "high.png"
    assert plot.main(_plot_args(str(run_dir), "--metrics", "orthonormality", "--out", str(low), "--dpi", "50")) == 0
    assert plot.main(_plot_args(str(run_dir), "--metrics", "orthonormality", "--out", str(high), "--dpi", "300")) == 0
    assert high.stat().st_size > 2 * low.stat().st_size
    pdf = tmp_path / "figure"
    assert plot.main(_plot_args(str(run_dir), "--metrics", "orthonormality", "--out", str(pdf), "--format", "pdf")) == 0
    assert pdf.read_bytes().startswith(b"%PDF")
