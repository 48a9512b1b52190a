"""Command line: a thin layer over pitcheck's Python API.

Bad input ends in a one-line error and exit status 2; a run whose state breaks down, in a message and
exit status 1; Ctrl-C, at any moment, in a one-line message (exit 130, or 2 with the checkpoint saved).
Only the standard library is imported at the top: Ctrl-C while numpy, scipy or torch load is still
inside main's handler.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from dataclasses import fields, replace

from .errors import PitcheckError


def _add_run_options(p: argparse.ArgumentParser, steps: int, vocab: int, dim: int) -> None:
    from .engine import OPTIMIZERS
    from .gradients import GRADIENT_MODELS
    from .trajectory import RunConfig as DEFAULTS  # the dataclass's defaults, as class attributes

    p.add_argument("--adversary", default=DEFAULTS.adversary,
                   help=f"comma-separated gradient models, summed: {', '.join(GRADIENT_MODELS)}")
    p.add_argument("--optimizer", default=DEFAULTS.optimizer, choices=OPTIMIZERS)
    p.add_argument("--lr", type=float, default=DEFAULTS.lr)
    p.add_argument("--steps", type=int, default=steps)
    # None: the teacher's shape when there is one, else the command's default (filled in by _config)
    p.add_argument("--vocab", type=int, default=None, help=f"V (default {vocab}, or the teacher's rows)")
    p.add_argument("--dim", type=int, default=None, help=f"D (default {dim}, or the teacher's columns)")
    p.set_defaults(default_shape=(vocab, dim))
    p.add_argument("--teacher", default="", metavar="FILE.npy|FILE.safetensors:TENSOR",
                   help="start Z at the polar factor of this V x D teacher embedding instead of at random")
    p.add_argument("--cond", type=float, default=DEFAULTS.cond, help="condition number of the initial T")
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    p.add_argument("--device", default=DEFAULTS.device, help="auto (CUDA when present), cpu or cuda")
    p.add_argument("--reproject-every", type=int, default=0, metavar="K",
                   help="re-project Z onto the manifold (polar) every K steps")
    p.add_argument("--reproject-threshold", type=float, default=0.0, metavar="TOL",
                   help="re-project when ||Z^T Z - I||_F exceeds TOL")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--force", action="store_true",
                   help="replace the run(s) already in --out instead of refusing (the start of a new run)")


def _add_lm_options(p: argparse.ArgumentParser) -> None:
    """Options of the lm gradient source (and --input-scale, which sparse_input takes too)."""
    from .lm import LMParams as LM

    p.add_argument("--input-scale", type=float, default=None, metavar="S",
                   help="scale of input-side (embedding) gradients against output-side ones (default 1)")
    g = p.add_argument_group("lm source (--adversary lm: a small causal LM on CPython's documentation text)")
    g.add_argument("--lm-seq-len", type=int, default=None, help=f"tokens of context (default {LM.seq_len})")
    g.add_argument("--lm-sequences", type=int, default=None, help=f"sequences per batch (default {LM.sequences})")
    g.add_argument("--lm-layers", type=int, default=None, help=f"transformer blocks (default {LM.layers})")
    g.add_argument("--lm-lr", type=float, default=None, help=f"Adam learning rate of the body (default {LM.body_lr})")
    g.add_argument("--lm-eval-sequences", type=int, default=None,
                   help=f"sequences each recorded loss averages (default {LM.eval_sequences})")
    g.add_argument("--lm-vocabulary", default=None, metavar="bpe|wordpiece:VOCAB.txt",
                   help="bpe (learned from the text, the default) or a pretrained model's WordPiece vocab.txt, "
                   "cut to --vocab tokens (that model's embedding table is then a --teacher)")


def _lm_over(args) -> dict:
    """RunConfig fields set by the lm options, refusing lm options without the lm source."""
    from .gradients import AdversaryParams
    from .lm import LMParams, uses_lm

    given = {field: getattr(args, opt) for opt, field in (
        ("lm_seq_len", "seq_len"), ("lm_sequences", "sequences"), ("lm_layers", "layers"), ("lm_lr", "body_lr"),
        ("lm_eval_sequences", "eval_sequences"), ("lm_vocabulary", "vocabulary")) if getattr(args, opt, None) is not None}
    over = {}
    if given:
        if not uses_lm(args.adversary):
            raise PitcheckError(f"--lm-* options apply to --adversary lm, not {args.adversary!r}")
        over["lm"] = replace(LMParams(), **given)
    if getattr(args, "input_scale", None) is not None:
        over["adversary_params"] = replace(AdversaryParams(), input_scale=args.input_scale)
    return over


def package_version() -> str:
    """The installed distribution's version; pitcheck.__version__ when run from a tree not installed."""
    from importlib import metadata

    from . import __version__

    try:
        return metadata.version("pitcheck")
    except metadata.PackageNotFoundError:
        return __version__


def build_parser() -> argparse.ArgumentParser:
    from .policy import POLICIES
    from .retractions import RETRACTIONS
    from .trajectory import RunConfig as DEFAULTS

    parser = argparse.ArgumentParser(prog="pitcheck", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="simulate one trajectory and write a run directory")
    p.add_argument("--backend", default="numpy", choices=["numpy", "torch"])
    p.add_argument("--precision", default="fp64", choices=list(POLICIES))
    # None: not given (the default, qr, for --head pit; the baselines refuse an explicit one)
    p.add_argument("--retraction", default=None, help=", ".join(RETRACTIONS) + " (default qr)")
    _add_run_options(p, DEFAULTS.steps, DEFAULTS.vocab, DEFAULTS.dim)
    p.add_argument("--head", default="pit", choices=["pit", "tied", "untied"],
                   help="PIT, or the baselines: standard tying (W = E^T) or two untied tables")
    p.add_argument("--no-shadow", action="store_true", help="torch backend: skip the float64 shadow")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    _add_lm_options(p)

    c = sub.add_parser("compare", help="sweep a grid of runs (retraction x precision x ...): a verdict, "
                       "summary.csv, report.md and plots")
    from .sweep import add_compare_options

    add_compare_options(c)

    g = sub.add_parser("plot", help="plot metrics of run directories against step")
    g.add_argument("runs", nargs="+")
    g.add_argument("--metrics", default="orthonormality,pinv_drift,trisolve_forward")
    g.add_argument("--out", required=True, help="figure file: .png, .svg or .pdf (no suffix: PNG)")

    v = sub.add_parser("validate", help="judge a third-party PIT implementation (module:factory) against the reference")
    _add_validate_options(v)

    from .bench import add_bench_parser
    from .stress import add_stress_parser

    add_stress_parser(sub)
    add_bench_parser(sub)
    from .lm.compare import add_heads_parser

    add_heads_parser(sub)
    _add_lm_options(sub.choices["heads"])
    return parser


def _add_validate_options(v: argparse.ArgumentParser) -> None:
    from .validate import CHECKS, api

    v.add_argument("target", help="module:factory or path/to/file.py:factory")
    v.add_argument("--dtype", default="float32", choices=["float64", "float32", "bfloat16", "float16"])
    v.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    v.add_argument("--vocab", type=int, default=api.DEFAULT_VOCAB)
    v.add_argument("--dim", type=int, default=api.DEFAULT_DIM)
    v.add_argument("--steps", type=int, default=api.DEFAULT_STEPS, help="trajectory steps")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--checks", default="all", help=f"comma-separated subset of: {', '.join(CHECKS)}")
    v.add_argument("--timeout", type=float, default=api.DEFAULT_TIMEOUT, help="seconds for the target's process")
    v.add_argument("--json", default=None, metavar="FILE")
    v.add_argument("--report", default=None, metavar="FILE.md")
    v.add_argument("--junit", default=None, metavar="FILE.xml")


def _config(args, **over):
    from .trajectory import RunConfig, teacher_shape

    if getattr(args, "resume", False) and args.force:
        raise PitcheckError("--resume continues a run and --force starts it over: give one of them")
    if getattr(args, "head", "pit") != "pit" and args.retraction is not None:
        raise PitcheckError(f"--head {args.head} has no retraction: --retraction applies to --head pit only")
    names = {f.name for f in fields(RunConfig)}
    values = {k: v for k, v in vars(args).items() if k in names and v is not None}
    # V and D follow the teacher unless given explicitly (then they must match it)
    shape = teacher_shape(args.teacher) if args.teacher else args.default_shape
    values["vocab"] = shape[0] if args.vocab is None else args.vocab
    values["dim"] = shape[1] if args.dim is None else args.dim
    return replace(RunConfig(), **values, **over)


def _import_torch_holding_ctrl_c() -> None:
    """Import torch with Ctrl-C held, then take any Ctrl-C that came meanwhile as KeyboardInterrupt.

    A KeyboardInterrupt raised while torch's C++ start-up is calling back into Python cannot unwind
    through it: the process aborts ('terminate called after throwing an instance of
    pybind11::error_already_set', SIGABRT) or a bare except inside the import swallows it. Blocking
    SIGINT in this thread is not enough (a thread the import starts may take the signal, and Python then
    runs the handler here, mid-import), so the handler itself only records the signal until the import is done.
    """
    import signal
    import threading

    if "torch" in sys.modules or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN or previous is None or not hasattr(signal, "pthread_sigmask"):
        # Ctrl-C ignored (a background job), a handler set outside Python, or no POSIX signal masks
        _import_torch()
        return
    pending: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            _import_torch()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # a held signal is recorded now
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:  # now delivered as the previous handler would have taken it
        if callable(previous):
            previous(signal.SIGINT, None)
        else:
            signal.raise_signal(signal.SIGINT)


def _import_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:  # pragma: no cover - a dependency; its absence is reported where it is used
        pass


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("pitcheck: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    from .trajectory import RunBreakdown, skipped_steps

    args = build_parser().parse_args(argv)
    if args.command != "plot":  # every other verb computes with torch
        _import_torch_holding_ctrl_c()
    progress = False if getattr(args, "no_progress", False) else None  # None: a bar only on a terminal
    try:
        if args.command == "run":
            from .trajectory import run

            cfg = _config(args, shadow=not args.no_shadow, **_lm_over(args))
            rows = run(cfg, args.out, resume=args.resume, progress=progress, force=args.force)
            last = rows[-1]
            losses = "".join(f"{k} {last[k]:.4f}  " for k in ("train_loss", "heldout_loss") if k in last)
            skipped = skipped_steps(args.out)
            skips = f"{sum(skipped.values())} of {last['step']} steps skipped (events.jsonl)  " if skipped else ""
            print(f"step {last['step']}: orthonormality {last['orthonormality']:.3e}  "
                  f"pinv_drift {last['pinv_drift']:.3e}  cond_T {last['cond_T']:.3e}  "
                  f"trisolve_backward_ratio {last['trisolve_backward_ratio']:.2f}  {losses}{skips}-> {args.out}")
        elif args.command == "compare":
            from .sweep import main_compare

            return main_compare(args)
        elif args.command == "plot":
            from .report import plot_runs

            print(plot_runs(args.runs, args.out, args.metrics.split(",")))
        elif args.command in ("stress", "bench", "heads"):
            return args.func(args)
        elif args.command == "validate":
            from .validate import validate
            from .validate.result import check_outputs

            check_outputs(args.json, args.report, args.junit)
            result = validate(args.target, args.dtype, device=args.device, vocab=args.vocab, dim=args.dim,
                              steps=args.steps, seed=args.seed, checks=args.checks, timeout=args.timeout)
            # the verdict is printed first: an output that still cannot be written loses nothing else
            print(result.table())
            print(result.summary(), file=sys.stderr if result.fatal else sys.stdout)
            result.write(args.json, args.report, args.junit)
            return result.exit_status
    except RunBreakdown as exc:
        print(f"pitcheck: breakdown: {exc}", file=sys.stderr)
        return 1
    except PitcheckError as exc:
        print(f"pitcheck: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError:
        print("pitcheck: error: out of memory; choose a smaller --vocab or --dim", file=sys.stderr)
        return 2
    except OSError as exc:
        # the edges turn the expected ones into PitcheckError; this keeps any other to one line too
        print(f"pitcheck: error: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
