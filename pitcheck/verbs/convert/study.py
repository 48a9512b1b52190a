"""The SmolLM2 continued-pretraining study: tied, untied and PIT heads, PIT in one or more conversion modes
(one run directory each, on the same batches), then one table and one figure of held-out loss and the
interface metrics per step. `smollm2_study` is what scripts/studies/smollm2_study.py runs."""
from __future__ import annotations

import csv
import io
import json
import math
import time
from pathlib import Path

from ...infra.errors import PitcheckError
from ...infra.plotting import pyplot, save_png_and_svg
from ...infra.rundir import write_atomic
from ...sources.pretrained.conversion import DEFAULT_MODE
from .continued import COLUMNS, ContinuedConfig, continued, read_rows

STUDY_HEADS = (("tied", ""), ("untied", ""), ("pit", "qr"), ("pit", "cholqr2"))
# the batches and windows of the committed studies (results/smollm2/)
STUDY_OPTIONS = dict(sequences=2, seq_len=32, eval_sequences=4)


def run_label(config: ContinuedConfig, with_mode: bool = False) -> str:
    """<head>_<precision>; with_mode: a PIT head's mode always named (pit-qr-keep-embedding_fp32)."""
    label = config.label()
    if with_mode and config.head == "pit" and config.mode == DEFAULT_MODE:
        label += f"-{DEFAULT_MODE}"
    return f"{label}_{config.precision}"


def parse_heads(text: str) -> list[tuple[str, str]]:
    """"tied,untied,pit-qr" -> [("tied", ""), ("untied", ""), ("pit", "qr")]."""
    return [tuple(h.split("-", 1)) if h.startswith("pit-") else (h, "") for h in text.split(",") if h]


def run_study(runs: Path | str, precisions=("fp32",), heads=STUDY_HEADS, modes=None, progress=None,
              existing_only: bool = False, **options) -> dict:
    """Train each head in each precision (a PIT head in each of `modes`; None: the default mode, runs named
    as before the modes existed) under RUNS/<label> (resuming what is there; existing_only: only the runs
    that have a directory there, starting none); returns {label: seconds taken by this call}."""
    from ...sources.pretrained.body import load_smollm2

    seconds = {}
    for precision in precisions:
        for head, retraction in heads:
            for mode in (modes or (DEFAULT_MODE,)) if head == "pit" else (DEFAULT_MODE,):
                config = ContinuedConfig(head=head, retraction=retraction or "qr", precision=precision, mode=mode,
                                         **options)
                label = run_label(config, with_mode=modes is not None)
                if existing_only and not (Path(runs) / label).is_dir():
                    continue
                start = time.monotonic()
                continued(Path(runs) / label, config, model=load_smollm2(), progress=progress)
                seconds[label] = time.monotonic() - start
    return seconds


def collect(runs: Path | str, labels=None) -> dict[str, list[dict]]:
    """The rows of each run under RUNS (only those named in `labels`, when given)."""
    found = {p.name: read_rows(p / "metrics.csv") for p in sorted(Path(runs).iterdir())
             if (p / "metrics.csv").is_file() and (labels is None or p.name in labels)}
    if not found:
        raise PitcheckError(f"{runs} holds no continued-pretraining runs")
    return found


def summary_csv(curves: dict[str, list[dict]]) -> bytes:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["run"] + COLUMNS)
    for label, rows in curves.items():
        for r in rows:  # a column a run was written without is NaN
            w.writerow([label] + [r["step"]] + [repr(float(r.get(k, math.nan))) for k in COLUMNS[1:]])
    return out.getvalue().encode()


PANELS = (("heldout_loss", "held-out loss (nats/token)", False), ("pinv_drift", "||W E - I||_F", True),
          ("orthonormality", "||Z^T Z - I||_F (PIT)", True), ("cond_T", "cond(T) (PIT)", True))


def plot_study(out: Path, curves: dict[str, list[dict]], stem: str = "smollm2", panels=PANELS[:3]) -> list[str]:
    """One panel per metric (2 x 2 for four), each run one colour in every panel."""
    plt = pyplot()
    cols = 2 if len(panels) == 4 else len(panels)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.8 * rows), squeeze=False)
    # a head (and mode) keeps its colour in every precision; the precision is the line's style
    heads = list(dict.fromkeys(label.rsplit("_", 1)[0] for label in curves))
    styles = {p: s for p, s in zip(dict.fromkeys(label.rsplit("_", 1)[-1] for label in curves), ("-", "--", ":", "-."))}
    for ax, (key, title, log) in zip(axes.flat, panels):
        for label, rows_ in curves.items():
            pts = [(r["step"], r[key]) for r in rows_ if r.get(key, math.nan) == r.get(key, math.nan)]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=2, label=label, color=f"C{heads.index(label.rsplit('_', 1)[0]) % 10}",
                        linestyle=styles.get(label.rsplit("_", 1)[-1], "-"))
        ax.set_title(title)
        ax.set_xlabel("step")
        if log:
            ax.set_yscale("log")
    # below the panels, where it hides no curve
    handles, names = axes.flat[0].get_legend_handles_labels()
    ncol = min(len(names), 4)
    fig.legend(handles, names, loc="lower center", ncol=ncol, fontsize=7, frameon=False)
    legend_rows = -(-len(names) // ncol)
    fig.tight_layout(rect=(0, (0.18 * legend_rows + 0.25) / fig.get_figheight(), 1, 1))  # 0.18 in a legend row
    return save_png_and_svg(plt, fig, out, stem)


def read_summary(path: Path | str) -> dict[str, list[dict]]:
    """The curves of a committed study's smollm2.csv (the inverse of summary_csv)."""
    curves: dict[str, list[dict]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            label = row.pop("run")
            curves.setdefault(label, []).append({k: (int(v) if k == "step" else float(v)) for k, v in row.items()})
    if not curves:
        raise PitcheckError(f"{path} holds no study rows")
    return curves


def write_study(out: Path | str, runs: Path | str, also: Path | str | None = None, labels=None,
                also_labels=None, also_steps: int | None = None, stem: str = "smollm2", panels=PANELS[:3]) -> list[str]:
    """OUT/<stem>.csv (every recorded row of the runs under RUNS, or of those in `labels`) and
    OUT/<stem>.png/.svg; with `also` (other studies' csv files, or one, e.g. the same heads in another precision, or the
    tied and untied heads on the same batches), the figure draws its curves too (those in `also_labels`, up
    to step `also_steps`, when given; an entry "OLD=NEW" draws run OLD under the name NEW); they are not copied
    into the csv."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    curves = collect(runs, labels)
    write_atomic(out / f"{stem}.csv", summary_csv(curves))
    drawn = curves
    if also:
        names = None if also_labels is None else dict(entry.split("=", 1) if "=" in entry else (entry, entry)
                                                      for entry in also_labels)
        other = {(k if names is None else names[k]): [r for r in rows if also_steps is None or r["step"] <= also_steps]
                 for path in ([also] if isinstance(also, (str, Path)) else also)
                 for k, rows in read_summary(path).items() if names is None or k in names}
        drawn = {**other, **curves}
    return [str(out / f"{stem}.csv")] + plot_study(out, drawn, stem, panels)


def smollm2_study(runs: Path | str, out: Path | str, steps: int = 100, precisions=("fp32", "bf16-mixed"),
                  heads=STUDY_HEADS, modes=None, record_every: int = 10, also=None, also_labels=None,
                  threads: int = 1, stem: str = "smollm2", progress=True, existing_only: bool = False) -> list[str]:
    """Run (or resume) the study and write OUT; the wall seconds of each run of this call are appended to
    OUT/timings.json. With `modes` the figure has a cond(T) panel and only this study's runs go in its csv."""
    from ...infra.threads import apply_thread_policy

    apply_thread_policy(threads)
    options = dict(steps=steps, **STUDY_OPTIONS, record_every=record_every, checkpoint_every=record_every)
    start = time.monotonic()
    seconds = run_study(runs, precisions=tuple(precisions), heads=heads, modes=modes, progress=progress,
                        existing_only=existing_only, **options)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    timings = out / "timings.json"
    log = json.loads(timings.read_text()) if timings.exists() else []
    log.append({"options": options, "precisions": ",".join(precisions), "threads": threads,
                **({"modes": list(modes)} if modes else {}),
                "seconds": {k: round(v, 1) for k, v in seconds.items()},
                "total_seconds": round(time.monotonic() - start, 1)})
    write_atomic(timings, (json.dumps(log, indent=1) + "\n").encode())
    labels = set(seconds) if modes else None
    panels = PANELS if modes else PANELS[:3]
    return write_study(out, runs, also=also, labels=labels, also_labels=also_labels, also_steps=steps if modes else None,
                       stem=stem, panels=panels)
