"""What several verbs' command lines share: the trajectory options, the lm source's options, a RunConfig
from parsed arguments, and importing torch with Ctrl-C held.

The library is imported inside the functions here and in each verb's module: every verb's parser is built
at start-up, and `pitcheck --help` should not wait for numpy, scipy and the model."""
from __future__ import annotations

import argparse
import os
import stat
import sys
import tempfile
from dataclasses import fields, replace
from pathlib import Path

from ..infra.errors import PitcheckError


def add_run_options(p: argparse.ArgumentParser, steps: int, vocab: int, dim: int) -> None:
    from ..model.engine import OPTIMIZERS
    from ..model.gradients import GRADIENT_MODELS, GRADIENT_STREAMS
    from ..trajectory import GPU_MIN_ELEMENTS, RunConfig as DEFAULTS  # the dataclass: its defaults as class attributes

    p.add_argument("--adversary", default=DEFAULTS.adversary,
                   help=f"comma-separated gradient models, summed: {', '.join(GRADIENT_MODELS)}")
    p.add_argument("--optimizer", default=DEFAULTS.optimizer, choices=OPTIMIZERS)
    p.add_argument("--lr", type=float, default=DEFAULTS.lr)
    p.add_argument("--steps", type=int, default=steps)
    # None: the teacher's shape when there is one, else the command's default (filled in by _config)
    p.add_argument("--vocab", type=int, default=None, help=f"V (default {vocab}, or the teacher's rows)")
    p.add_argument("--dim", type=int, default=None, help=f"D (default {dim}, or the teacher's columns)")
    p.set_defaults(default_shape=(vocab, dim))
    p.add_argument("--teacher", default="", metavar="FILE.npy|FILE.safetensors:TENSOR|FILE.gguf:TENSOR|smollm2",
                   help="start from this V x D embedding table instead of at random: a GGUF table's exact PIT "
                        "form (--teacher-mode), a .npy or safetensors table's polar factor")
    p.add_argument("--teacher-mode", default="", metavar="MODE",
                   help="the conversion the teacher's start is: keep-embedding (a GGUF teacher's default: "
                        "E = E0), keep-head, balanced (T0 = I; a table's default), sqrt (pitcheck convert --help)")
    p.add_argument("--cond", type=float, default=DEFAULTS.cond, help="condition number of the initial T")
    p.add_argument("--gradient-stream", default=DEFAULTS.gradient_stream, choices=GRADIENT_STREAMS,
                   help="where the gradient models draw: numpy (float64 on the host; every model) or counter "
                        "(counter-based float64 normals on the run's device, the same bits on CPU and CUDA; "
                        "gaussian only)")
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    p.add_argument("--device", default=DEFAULTS.device,
                   help=f"auto (CUDA when present and V x D is at least {GPU_MIN_ELEMENTS}: a smaller Z steps faster "
                        "on one CPU core), cpu or cuda")
    p.add_argument("--reproject-every", type=int, default=0, metavar="K",
                   help="re-project Z onto the manifold (polar) every K steps")
    p.add_argument("--reproject-threshold", type=float, default=0.0, metavar="TOL",
                   help="re-project when ||Z^T Z - I||_F exceeds TOL")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--force", action="store_true",
                   help="replace the run(s) already in --out instead of refusing (the start of a new run)")


def add_lm_options(p: argparse.ArgumentParser) -> None:
    """Options of the lm gradient source (and --input-scale, which sparse_input takes too)."""
    from ..sources.lm import LMParams as LM

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


def lm_overrides(args) -> dict:
    """RunConfig fields set by the lm options, refusing lm options without the lm source."""
    from ..model.gradients import AdversaryParams
    from ..sources.lm import LMParams, uses_lm

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


def run_config(args, **over):
    from ..trajectory import RunConfig, teacher_shape
    from ..trajectory.plan import head_named

    if getattr(args, "resume", False) and args.force:
        raise PitcheckError("--resume continues a run and --force starts it over: give one of them")
    if not head_named(getattr(args, "head", RunConfig.head)).has_retraction and args.retraction is not None:
        raise PitcheckError(f"--head {args.head} has no retraction: --retraction applies to --head pit only")
    names = {f.name for f in fields(RunConfig)}
    values = {k: v for k, v in vars(args).items() if k in names and v is not None}
    # V and D follow the teacher unless given explicitly (then they must match it)
    shape = teacher_shape(args.teacher) if args.teacher else args.default_shape
    values["vocab"] = shape[0] if args.vocab is None else args.vocab
    values["dim"] = shape[1] if args.dim is None else args.dim
    return RunConfig(**{**values, **over})  # not replace(RunConfig(), ...): the backend follows the precision given


def check_writable(files=(), dirs=()) -> None:
    """Each output can be made where it goes, tried before the work: a file by creating (and removing) a
    temporary file in its directory, as write_atomic's PATH.tmp is made; a directory to create by making (and
    removing) one in its nearest existing ancestor. Permission bits do not tell (root, /proc, a read-only
    mount): the files of a finished run would otherwise be lost at its end. (option, path) pairs; None skipped.
    Devices, FIFOs and a path whose directory is missing are left to the verbs' own checks."""
    def refuse(option, path, where, exc):
        raise PitcheckError(f"{option} {path}: cannot create a file in {where}: {exc.strerror or exc}") from None

    for option, path in files:
        if path is None or str(path).strip() == "":
            continue
        try:
            # through every link, as writing opens it: /dev/stdout onto a pipe is a FIFO, though its
            # realpath (/proc/PID/fd/pipe:[N]) names nothing
            if not stat.S_ISREG(os.stat(path).st_mode):
                continue  # a device or FIFO is written in place
        except FileNotFoundError:
            pass
        except OSError:
            continue
        real = Path(os.path.realpath(path))
        if not real.parent.is_dir():
            continue
        try:
            fd, probe = tempfile.mkstemp(dir=real.parent, prefix=".pitcheck-probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            refuse(option, path, real.parent, exc)
    for option, path in dirs:
        if path is None or str(path).strip() == "":
            continue
        ancestor = Path(os.path.realpath(path))
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            continue
        try:
            os.rmdir(tempfile.mkdtemp(dir=ancestor, prefix=".pitcheck-probe-"))
        except OSError as exc:
            refuse(option, path, ancestor, exc)


def import_torch_holding_ctrl_c() -> None:
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
        import_torch()
        return
    pending: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            import_torch()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # a held signal is recorded now
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:  # now delivered as the previous handler would have taken it
        if callable(previous):
            previous(signal.SIGINT, None)
        else:
            signal.raise_signal(signal.SIGINT)


def import_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:  # pragma: no cover - a dependency; its absence is reported where it is used
        pass


class CtrlCNeverSwallowed:
    """While the CLI runs, a Ctrl-C is never lost nor printed as a traceback.

    Python runs the SIGINT handler wherever the main thread is, and a KeyboardInterrupt raised inside a
    weakref callback or a finaliser (importlib's module-lock callback, measured at start-up) cannot
    propagate: Python prints 'Exception ignored in ...' with a traceback and the run goes on. Here such
    an interruption is delivered again at once, from a thread, so that it lands where it can unwind. A
    Ctrl-C still pending as the CLI returns is reported as an interruption rather than raised after it.
    Installed only in the main thread and only over Python's default handler: an ignored Ctrl-C (a
    background job) and a caller's own handler are left alone.
    """

    def __init__(self) -> None:
        import signal
        import threading

        self._lock = threading.Lock()
        self._closing = False
        self.pending = False
        self._in_hook = 0
        self._installed = (threading.current_thread() is threading.main_thread()
                           and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        if self._installed:
            self._previous_hook = sys.unraisablehook
            signal.signal(signal.SIGINT, self._on_ctrl_c)
            sys.unraisablehook = self._on_unraisable

    def _on_ctrl_c(self, signum, frame) -> None:
        if self._closing:
            self.pending = True  # reported by close, not raised after the CLI has returned
            return
        if self._in_hook:  # raised here it would be lost as well: delivered again after the hook returns
            self._deliver_again_soon()
            return
        raise KeyboardInterrupt

    def _on_unraisable(self, unraisable) -> None:
        if not issubclass(unraisable.exc_type, KeyboardInterrupt):
            self._previous_hook(unraisable)
            return
        self._in_hook += 1
        try:
            self._deliver_again_soon()
        finally:
            self._in_hook -= 1

    def _deliver_again_soon(self) -> None:
        import threading

        threading.Thread(target=self._deliver_again, daemon=True).start()

    def _deliver_again(self) -> None:
        import _thread
        import signal
        import time

        time.sleep(0.01)  # the main thread has left the hook by then, almost always; if not, it reschedules
        with self._lock:  # not once close has begun: the handler it restores would raise past the CLI
            if not self._closing:
                _thread.interrupt_main(signal.SIGINT)

    def close(self) -> None:
        """Restore the previous handler and hook; raise KeyboardInterrupt if a Ctrl-C is still pending."""
        if not self._installed:
            return
        import signal

        with self._lock:
            self._closing = True
        # signal.signal runs any pending handler first: ours, which now only records
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = self._previous_hook
        if self.pending:
            raise KeyboardInterrupt
