"""`pitcheck plot`: any metrics of any run directories against step, one panel per metric, a line per run.

Each run is labelled by what sets it apart from the others, read from its manifest's config (head, precision,
retraction, adversary, ...); what all of them share goes in the figure's title. Colours and markers come from
the registries (a precision's or a retraction's own) when those tell the runs apart, else from a palette that
repeats no (colour, marker) pair. The legend sits below the panels, never over a curve."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..infra.errors import PitcheckError
from ..infra.plotting import (COLUMN_WIDTH, DEFAULT_DPI, PAGE_WIDTH, SMALL_PT, TITLE_PT, check_figure_path,
                              draw_metric, plain_ticks_within_a_decade, pyplot, save_figure)
from ..infra.rundir import MANIFEST, METRIC_COLUMNS, check_out_file, read_manifest, read_metrics
from ..trajectory.plan import head_named
from ..model.retractions import RECORDS
from ..numerics.policy import PRECISION_STYLES, precision_style

# the config fields a label or the title names, in this order
FIELDS = ("head", "precision", "retraction", "adversary", "optimizer", "lr", "shape", "steps", "seed", "cond",
          "teacher", "input scale", "shards", "reprojection", "backend", "device")
# a field whose value every run shares is named in the title, unless it says nothing a reader needs
QUIET = {"cond": "cond(T0) 1", "teacher": "no teacher", "input scale": "input scale 1", "shards": "1 shard",
         "reprojection": "no reprojection"}
UNTITLED = ("backend", "device")
# the metrics people plot most, said as a reader knows them (mathtext)
METRIC_NAMES = {"orthonormality": r"$\Vert Z^{\top}Z - I\Vert_F$", "pinv_drift": r"$\Vert WE - I\Vert_F$",
                "cond_T": "cond(T)", "penrose": "largest Penrose residual",
                "shadow_Z": "Z against its float64 shadow", "shadow_T": "T against its float64 shadow",
                "pinv_error": r"$\Vert W - E^{+}\Vert_F / \Vert E^{+}\Vert_F$"}
PANELS_PER_ROW = 3


def run_fields(manifest: dict) -> dict[str, str | None]:
    """A run's config as the words of its label: field -> text (None: the field does not apply to it)."""
    c, params = manifest["config"], manifest["config"].get("adversary_params") or {}
    head = str(c.get("head", "pit"))
    try:
        has_retraction = head_named(head).has_retraction
    except PitcheckError:
        has_retraction = True
    every, threshold = c.get("reproject_every") or 0, c.get("reproject_threshold") or 0
    reprojection = ("no reprojection" if not (every or threshold) else
                    f"reprojection every {every}" if every else f"reprojection past {threshold:g}")
    shards = int(c.get("shards", 1) or 1)
    return {
        "head": head, "precision": c.get("precision"), "adversary": c.get("adversary"),
        "retraction": c.get("retraction") if has_retraction else None, "optimizer": c.get("optimizer"),
        "lr": f"lr {c['lr']:g}" if isinstance(c.get("lr"), (int, float)) else None,
        "shape": f"V x D = {c.get('vocab')} x {c.get('dim')}", "steps": f"{c.get('steps')} steps",
        "seed": f"seed {c.get('seed')}", "cond": f"cond(T0) {c.get('cond', 1):g}",
        "teacher": f"teacher {Path(c['teacher']).name}" if c.get("teacher") else "no teacher",
        "input scale": f"input scale {params.get('input_scale', 1):g}",
        "shards": f"{shards} shard{'s' if shards > 1 else ''}", "reprojection": reprojection,
        "backend": c.get("backend"), "device": manifest.get("device"),
    }


def describe(fields: list[dict | None], names: list[str]) -> tuple[list[str], str, list[str]]:
    """(a label per run, the legend's title, the figure title's items): a run's label holds the fields whose
    values differ between the runs, the title those they share (a field that applies to some runs only, as
    a retraction to PIT and not to the baseline heads, says so). A run without a manifest, or two runs no
    field tells apart, are named by their directory."""
    known = [f for f in fields if f is not None]

    def values(k):
        return list(dict.fromkeys(f[k] for f in known if f[k] is not None))

    varying = [k for k in FIELDS if len(values(k)) > 1]
    labels = [", ".join(str(f[k]) for k in varying if f[k] is not None) if f is not None else name
              for f, name in zip(fields, names)]
    labels = [label or name for label, name in zip(labels, names)]
    if len(set(labels)) < len(labels):  # the same config twice (a rerun, another pitcheck): the directory too
        labels = [f"{label} ({name})" if labels.count(label) > 1 else label for label, name in zip(labels, names)]
    legend_title = ", ".join(varying) if varying and all(f is not None for f in fields) else ""
    said = []
    for k in FIELDS:
        if k in varying or k in UNTITLED or len(values(k)) != 1 or values(k)[0] == QUIET.get(k):
            continue
        text = f"{k} {values(k)[0]}" if k in ("head", "precision", "retraction", "adversary", "optimizer") else values(k)[0]
        said.append(text + (" (where it applies)" if any(f[k] is None for f in known) else ""))
    return labels, legend_title, said


def run_styles(fields: list[dict | None]) -> list[dict]:
    """A colour and marker per run: its precision's (PRECISION_STYLES) where precisions tell the runs apart, its
    retraction's where retractions do (both: the precision's colour, the retraction's marker); else, or where
    two runs would look alike, a palette of the registries' colours whose (colour, marker) pairs never repeat."""
    varies = {k: len({f[k] if f else None for f in fields}) > 1 for k in ("precision", "retraction")}
    styles = []
    for f in fields:
        prec = precision_style(f["precision"]) if f and f["precision"] in PRECISION_STYLES else None
        ret = RECORDS[f["retraction"]].style if f and f["retraction"] in RECORDS else None
        colour = prec.colour if varies["precision"] and prec else ret.colour if varies["retraction"] and ret else None
        marker = ret.marker if varies["retraction"] and ret else prec.marker if varies["precision"] and prec else None
        styles.append({"color": colour, "marker": marker})
    pairs = [(s["color"], s["marker"]) for s in styles]
    if None in [c for pair in pairs for c in pair] or len(set(pairs)) < len(pairs):
        return palette(len(fields))
    return styles


def palette(n: int) -> list[dict]:
    """n styles, no two alike: the registries' colours in turn, each round of them with the next marker."""
    colours = list(dict.fromkeys([s.colour for s in PRECISION_STYLES.values()] +
                                 [r.style.colour for r in RECORDS.values()]))
    markers = ["o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p"]
    return [{"color": colours[k % len(colours)], "marker": markers[(k + k // len(colours)) % len(markers)]}
            for k in range(n)]


# what `pitcheck plot` draws when no --metrics is given
DEFAULT_METRICS = ("orthonormality", "pinv_drift", "trisolve_forward")


def read_runs(run_dirs: list[Path | str], metrics: list[str]) -> list[tuple[str, dict | None, list[dict]]]:
    """(directory name, label fields or None, metrics rows) of each run; a one-line reason if one is not a run."""
    runs = []
    for d in run_dirs:
        path = Path(d) / "metrics.csv"
        if not path.is_file():
            raise PitcheckError(f"{d} is not a run directory (no metrics.csv)")
        rows = read_metrics(path)
        if not rows:
            raise PitcheckError(f"{path} has no rows")
        try:
            fields = run_fields(read_manifest(Path(d) / MANIFEST))
        except (PitcheckError, KeyError, TypeError, ValueError):  # no manifest, or not one this pitcheck reads
            fields = None
        runs.append((Path(d).resolve().name or str(d), fields, rows))
    require_columns(run_dirs, runs, metrics)
    return runs


def require_columns(run_dirs: list[Path | str], runs: list[tuple], metrics: list[str]) -> None:
    """A one-line reason if a run's metrics.csv lacks one of these columns."""
    for d, (_, _, rows) in zip(run_dirs, runs):
        missing = [m for m in metrics if m not in rows[0]]
        if missing:
            raise PitcheckError(f"{Path(d) / 'metrics.csv'} has no column {', '.join(missing)}")


def draw_runs(plt, runs: list[tuple[str, dict | None, list[dict]]], metrics: list[str],
              lacking: dict[str, list[int]]):
    """The figure: a panel per metric (PANELS_PER_ROW to a row), a line per run, the legend below them;
    lacking: per metric, the runs (their indices) that do not record it."""
    labels, legend_title, title = describe([f for _, f, _ in runs], [name for name, _, _ in runs])
    styles = run_styles([f for _, f, _ in runs])
    ncols = min(PANELS_PER_ROW, len(metrics))
    nrows = -(-len(metrics) // ncols)
    width = COLUMN_WIDTH if ncols == 1 else PAGE_WIDTH
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, 2.1 * nrows + 0.5), squeeze=False, layout="constrained")
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(metrics):]:
        ax.set_visible(False)
    for (_, _, rows), label, style in zip(runs, labels, styles):
        for ax, metric in zip(flat, metrics):
            draw_metric(ax, rows, metric, label, **style, markevery=_markevery(len(rows)))
    for ax, metric in zip(flat, metrics):
        name = METRIC_NAMES.get(metric)
        note = ("\nnot recorded: " + ", ".join(labels[k] for k in lacking[metric])) if lacking[metric] else ""
        ax.set_title(f"{name} ({metric})" + note if name else metric + note)
        ax.set_xlabel("step (0 drawn at 1)")
        ax.grid(True, which="major", alpha=0.3)
        plain_ticks_within_a_decade(ax)
    # the legend where every run has a line: the first panel may lack a baseline's
    legend_ax = next((ax for ax, m in zip(flat, metrics) if not lacking[m]), flat[0])
    handles, names = legend_ax.get_legend_handles_labels()
    longest = max((len(n) for n in names), default=1)
    ncol = max(1, min(len(names), int(width * 72 / (0.55 * SMALL_PT * longest + 2.5 * SMALL_PT))))
    if len(runs) > 1 or runs[0][1] is None:  # one run with a manifest: the title says what it is
        fig.legend(handles, names, loc="outside lower center", ncol=ncol, title=legend_title or None, frameon=False)
    if title:
        fig.suptitle(wrap_items(title, int(width * 72 / (0.6 * TITLE_PT))))
    return fig


def wrap_items(items: list[str], chars: int) -> str:
    """items joined by ", " in lines of at most `chars` characters, broken between items, never inside one."""
    lines = [""]
    for item in items:
        if lines[-1] and len(lines[-1]) + 2 + len(item) > chars:
            lines[-1] += ","
            lines.append("")
        lines[-1] += (", " if lines[-1] else "") + item
    return "\n".join(lines)


def _markevery(n: int) -> int:
    return max(1, math.ceil(n / 12))


def plot_runs(run_dirs: list[Path | str], out_png: Path | str, metrics: list[str] | None = None,
              dpi: int = DEFAULT_DPI, fmt: str | None = None) -> Path:
    """Any metrics of any runs against step, one panel per metric, a line per run; a PNG, SVG or PDF file
    as `fmt` (default: out_png's suffix) says, at `dpi`. metrics None: those of DEFAULT_METRICS that some run
    records (a stress target's run has no triangular-solve column)."""
    out_png = check_out_file(out_png, "--out") if fmt else check_figure_path(out_png)
    read = None
    if metrics is None:
        read = read_runs(run_dirs, [])
        metrics = recorded_defaults(read)
    runs, lacking = checked_runs(run_dirs, metrics, read)
    plt = pyplot()
    return save_figure(plt, draw_runs(plt, runs, metrics, lacking), Path(out_png), dpi=dpi, fmt=fmt)


def recorded_defaults(runs: list[tuple]) -> list[str]:
    """The DEFAULT_METRICS some of these runs (read_runs) records (a column with a finite value in one of
    them); all of them where none does, for checked_runs to say why."""
    kept = [m for m in DEFAULT_METRICS
            if any(m in rows[0] and not np.isnan([r[m] for r in rows]).all() for _, _, rows in runs)]
    return kept or list(DEFAULT_METRICS)


def checked_runs(run_dirs: list[Path | str], metrics: list[str], runs: list[tuple] | None = None):
    """The runs (read_runs, or these, already read) and, per metric, the runs (indices) that do not record it; a
    one-line reason if a metric is unknown or no run records it."""
    unknown = [m for m in metrics if m not in METRIC_COLUMNS[1:]]
    if not metrics or unknown:
        raise PitcheckError(f"unknown metric {', '.join(unknown) or '(none given)'}; "
                            f"choose from {', '.join(METRIC_COLUMNS[1:])}")
    if runs is None:
        runs = read_runs(run_dirs, metrics)
    else:
        require_columns(run_dirs, runs, metrics)
    # a metric a run does not record (a baseline head has no T, a numpy run no shadow) is all NaN there
    lacking = {m: [k for k, (_, _, rows) in enumerate(runs) if np.isnan([r[m] for r in rows]).all()] for m in metrics}
    empty = [m for m in metrics if len(lacking[m]) == len(runs)]
    if empty:
        raise PitcheckError(f"no run given records {', '.join(empty)} (all NaN: not applicable to these runs); "
                            "leave it out of --metrics")
    return runs, lacking
