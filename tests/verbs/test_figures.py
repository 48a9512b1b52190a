"""Figures: every precision and every retraction drawn in a colour and marker of its own; one style in points for a
paper's column; `pitcheck plot`'s labels (from the runs' configs), legend (off the data), --dpi and --format;
compare's growth figure with W E - I under each Z^T Z - I panel."""
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


# ---- the figures' style, `pitcheck plot`'s legend and labels, compare's growth figure --------------------
def _text_sizes(fig, kind):
    """Font sizes (points) of `fig`'s visible legend texts ("legend") or tick labels ("ticks")."""
    if kind == "legend":
        legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
        return [t.get_fontsize() for lg in legends for t in [*lg.get_texts(), lg.get_title()] if t.get_text()]
    return [t.get_fontsize() for ax in fig.axes if ax.get_visible()
            for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_visible() and t.get_text()]


def _overlaps(fig):
    """The axes (their titles) whose data area a legend of `fig` covers, in display coordinates."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert legends, "no legend drawn"
    return [ax.get_title() or "?" for lg in legends for ax in fig.axes if ax.get_visible()
            and lg.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))]


def test_the_style_sets_paper_sizes_in_points():
    from pitcheck.infra.plotting import MIN_PT, pyplot

    plt = pyplot()
    for key in ("legend.fontsize", "xtick.labelsize", "ytick.labelsize", "font.size", "axes.labelsize"):
        assert plt.rcParams[key] >= 7, key
    assert MIN_PT >= 7 and 8 <= plt.rcParams["font.size"] <= 9


def test_no_text_under_the_minimum_reaches_a_file(tmp_path):
    from pitcheck.infra.plotting import MIN_PT, pyplot, readable

    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([1, 2], label="a")
    ax.legend(fontsize=5)
    ax.text(0, 0, "note", fontsize=4)
    readable(fig)
    assert min(_text_sizes(fig, "legend")) >= MIN_PT
    assert min(t.get_fontsize() for t in ax.texts) >= MIN_PT
    plt.close(fig)


@pytest.fixture(scope="module")
def hashed_runs(tmp_path_factory):
    """Three runs (heads pit, tied, untied) in directories named as compare's cells are, with a hash."""
    from pitcheck.trajectory import RunConfig, run

    root = tmp_path_factory.mktemp("hashed")
    dirs = []
    for head, digest in (("pit", "3f9a2c1e"), ("tied", "b7d04e55"), ("untied", "0c6e9f12")):
        d = root / f"fp64-{head}-gaussian-32x4-seed0-{digest}"
        run(RunConfig(backend="numpy", precision="fp64", head=head, steps=12, vocab=32, dim=4), d, progress=False)
        dirs.append(d)
    return dirs


def _plot_figure(dirs, metrics):
    from pitcheck.infra.plotting import pyplot
    from pitcheck.verbs.plot import checked_runs, draw_runs

    runs, lacking = checked_runs(dirs, metrics)
    return draw_runs(pyplot(), runs, metrics, lacking)


@pytest.mark.parametrize("metrics", [["pinv_drift"], ["pinv_drift", "orthonormality", "penrose"],
                                     ["pinv_drift", "orthonormality", "penrose", "penrose_2", "penrose_1"]])
def test_plot_legend_covers_no_panel_and_fonts_are_readable(hashed_runs, metrics):
    fig = _plot_figure(hashed_runs, metrics)
    assert _overlaps(fig) == []
    assert min(_text_sizes(fig, "legend")) >= 7 and min(_text_sizes(fig, "ticks")) >= 7
    assert fig.get_figwidth() <= 7.0  # a paper's page; one panel a column
    assert (fig.get_figwidth() <= 3.3) == (len(metrics) == 1)


def test_plot_labels_say_what_differs_and_the_title_what_is_shared(hashed_runs):
    fig = _plot_figure(hashed_runs, ["pinv_drift"])
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["pit", "tied", "untied"]
    assert not [label for label in labels for d in hashed_runs if d.name in label or "3f9a2c1e" in label]
    assert legend.get_title().get_text() == "head"
    title = fig._suptitle.get_text().replace("\n", " ")
    assert "precision fp64" in title and "V x D = 32 x 4" in title and "12 steps" in title
    assert "retraction qr (where it applies)" in title  # PIT's, which the baseline heads have none of


def test_plot_labels_fall_back_to_the_directory_only_where_configs_agree(tmp_path, hashed_runs):
    import shutil

    twin = tmp_path / "rerun"
    shutil.copytree(hashed_runs[1], twin)
    fig = _plot_figure([hashed_runs[1], twin], ["pinv_drift"])
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == [hashed_runs[1].name, "rerun"]


def test_plot_colours_come_from_the_registries_and_never_repeat():
    from pitcheck.verbs.plot import run_styles

    fields = [{"precision": p, "retraction": "qr"} for p in ("fp32", "bf16", "fp8-logits")]
    assert [s["color"] for s in run_styles(fields)] == [precision_style(p).colour for p in ("fp32", "bf16", "fp8-logits")]
    fields = [{"precision": "fp32", "retraction": r} for r in ("qr", "cayley")]
    assert [s["marker"] for s in run_styles(fields)] == [RECORDS[r].style.marker for r in ("qr", "cayley")]
    seeds = run_styles([{"precision": "fp32", "retraction": "qr"}] * 40)  # runs no registry tells apart
    pairs = [(s["color"], s["marker"]) for s in seeds]
    assert len(set(pairs)) == 40 and len({c for c, _ in pairs[:20]}) == 20


@pytest.fixture(scope="module")
def fp8_sweep(tmp_path_factory):
    """fp32 and fp8-logits under qr: Z at the same level in both, W E = I broken by the FP8 logits GEMM."""
    from pitcheck.verbs.compare import compare, load_grid, override

    out = tmp_path_factory.mktemp("sweep")
    grid = override(load_grid(quick=True), retraction=["qr", "cholqr2"], precision=["fp32", "fp8-logits"],
                    adversary=["gaussian"], seed=[0], shape=["64x8"], optimizer=["adam"], lr=[0.001], steps=30)
    return out, grid, compare(out, grid, workers=1, progress=False)


def test_growth_figure_draws_pinv_drift_under_each_orthonormality_panel(fp8_sweep):
    from pitcheck.infra.plotting import pyplot
    from pitcheck.verbs.compare.figures import DRIFT, ORTHO, SweepFigures

    out, grid, info = fp8_sweep
    fig = SweepFigures(out, grid, info["rows"]).growth(pyplot())
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 4  # qr and cholqr2, each Z's panel above W E's
    assert [ax.get_ylabel() for ax in visible[:1]] == [ORTHO] and DRIFT in [ax.get_ylabel() for ax in visible]

    def last(ax, colour):
        (line,) = [ln for ln in ax.get_lines() if ln.get_color() == colour and ln.get_linestyle() == "-"]
        return line.get_ydata()[-1]

    fp32, fp8 = precision_style("fp32").colour, precision_style("fp8-logits").colour
    top, bottom = fig.axes[0], fig.axes[fig.axes.index(fig.axes[0]) + 2]  # rows: Z, then W E
    assert bottom.get_ylabel() == DRIFT
    rows = {r["precision"]: r for r in info["rows"] if r["retraction"] == "qr"}
    assert last(bottom, fp8) == pytest.approx(rows["fp8-logits"]["final_pinv_drift"])
    assert last(bottom, fp8) > 100 * last(bottom, fp32)  # the broken tie shows...
    assert last(top, fp8) < 10 * last(top, fp32)  # ...where Z alone looks like fp32's
    assert _overlaps(fig) == []
    assert min(_text_sizes(fig, "legend")) >= 7 and min(_text_sizes(fig, "ticks")) >= 7
    assert fig.get_figwidth() <= 7.0


def test_retractions_figure_draws_each_precisions_pinv_drift_too(fp8_sweep):
    from pitcheck.infra.plotting import pyplot
    from pitcheck.verbs.compare.figures import DRIFT, ORTHO, SweepFigures, retraction_style

    out, grid, info = fp8_sweep
    fig = SweepFigures(out, grid, info["rows"]).retractions(pyplot())
    (fp32_top, fp8_top), (fp32_drift, fp8_drift) = fig.axes[0:2], fig.axes[2:4]  # precisions across, Z over W E
    assert [fp32_top.get_title(), fp8_top.get_title()] == ["fp32", "fp8-logits"]
    assert (fp32_top.get_ylabel(), fp32_drift.get_ylabel()) == (ORTHO, DRIFT)

    def last(ax):
        (line,) = [ln for ln in ax.get_lines() if ln.get_color() == retraction_style("qr").colour]
        return line.get_ydata()[-1]

    assert last(fp8_drift) > 100 * last(fp32_drift) and last(fp8_top) < 10 * last(fp32_top)


def test_every_sweep_figure_keeps_its_legend_off_the_data(fp8_sweep):
    from pitcheck.infra.plotting import pyplot
    from pitcheck.verbs.compare.figures import FIGURES, SweepFigures

    out, grid, info = fp8_sweep
    figures = SweepFigures(out, grid, info["rows"])
    for stem in FIGURES:
        fig = getattr(figures, stem)(pyplot())
        assert _overlaps(fig) == [], stem
        assert min(_text_sizes(fig, "legend") + _text_sizes(fig, "ticks")) >= 7, stem
    assert {f"{stem}.{ext}" for stem in FIGURES for ext in ("png", "svg")} <= {p.name for p in out.iterdir()}


def test_a_wrapped_title_never_breaks_a_formula():
    from pitcheck.verbs.compare.figures import DRIFT, ORTHO, wrap

    text = f"Per retraction: {ORTHO} (upper panel; dashed: each floor) and {DRIFT}, the pinv drift (lower) " * 3
    lines = wrap(text, 3.3).split("\n")
    assert len(lines) > 3 and all(line.count("$") % 2 == 0 for line in lines)
    assert " ".join(lines).split() == text.split()
