"""A validation's result and its renderings: terminal table, JSON, markdown, JUnit XML (the same data)."""
from __future__ import annotations

import json
import math
import shutil
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from ...infra.junit import ERROR, FAILURE, SKIPPED, Case, Outcome, Suite, junit_xml
from ...infra.rundir import check_distinct_outputs, check_out_file, check_outputs_spare_inputs, write_atomic
from .checks import CheckResult
from .target import target_source

EXIT_PASS, EXIT_FAIL, EXIT_TARGET = 0, 1, 2
# a reason wrapped onto more lines than this is cut in the terminal; --report and --json keep all of it
MAX_REASON_LINES = 8
# the size (V, D) the checks' resolution is set for: smaller runs may leave a check unresolved
FULL_VOCAB, FULL_DIM = 2048, 32
# words of a reason that say the dtype or the differences could not resolve a measurement at this size
UNRESOLVED = ("cannot resolve", "resolves no")


@dataclass
class ValidationResult:
    target: str
    dtype: str
    device: str
    vocab: int
    dim: int
    steps: int
    seed: int
    checks: list[CheckResult] = field(default_factory=list)
    fatal: str = ""  # the target could not be imported, built or run: exit 2
    seconds: float = 0.0
    world_size: int | None = None  # the ranks of a sharded target (None: one process)
    restarts: list = field(default_factory=list)  # why a fresh worker took over (a lost device context)

    @property
    def exit_status(self) -> int:
        if self.fatal:
            return EXIT_TARGET
        return EXIT_FAIL if any(c.verdict in ("fail", "error") for c in self.checks) else EXIT_PASS

    @property
    def ok(self) -> bool:
        return self.exit_status == EXIT_PASS

    def by_name(self) -> dict[str, CheckResult]:
        return {c.name: c for c in self.checks}

    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.verdict in ("fail", "error")]

    def summary(self) -> str:
        counts = {v: sum(c.verdict == v for c in self.checks) for v in ("pass", "fail", "inconclusive", "error")}
        ranks = f", {self.world_size} ranks" if self.world_size is not None else ""
        head = f"{self.target} [{self.dtype}, V={self.vocab}, D={self.dim}{ranks}]: "
        if self.fatal:
            return head + f"target error: {self.fatal}"
        text = f"{counts['fail'] + counts['error']} of {len(self.checks)} checks failed"
        extra = [f"{counts['inconclusive']} inconclusive"] if counts["inconclusive"] else []
        if self.restarts:
            # a device-side assert (ids out of range) poisons a CUDA context: what followed ran in a fresh one
            extra.append(f"the device's context was lost {len(self.restarts)} time"
                         f"{'s' if len(self.restarts) > 1 else ''} and the checks after it ran in a fresh process")
        return head + text + (f" ({', '.join(extra)})" if extra else "") + f" in {self.seconds:.1f} s"

    def to_json(self) -> dict:
        return {
            "target": self.target, "dtype": self.dtype, "device": self.device, "vocab": self.vocab,
            "dim": self.dim, "steps": self.steps, "seed": self.seed, "world_size": self.world_size,
            "exit_status": self.exit_status, "fatal": self.fatal, "seconds": round(self.seconds, 3),
            "restarts": list(self.restarts),
            "summary": self.summary(), "checks": [c.to_json() for c in self.checks],
        }

    # ---- renderings ----------------------------------------------------------------------------
    HEADER = ("check", "verdict", "measured", "ratio", "threshold", "reason")

    def rows(self) -> list[tuple[str, ...]]:
        return [(c.name, c.verdict, _fmt(c.measured), _fmt(c.value), _fmt(c.threshold), c.reason or "-")
                for c in self.checks]

    def table(self, width: int | None = None, report: str | None = None) -> str:
        """One row per check; `measured` is the raw error, `ratio` it over its unit (see checks.py). The reason
        is wrapped under its column to `width` (the terminal's by default), cut after MAX_REASON_LINES lines
        with a pointer to `report` (the --report file) where the full reason is."""
        width = width or max(80, shutil.get_terminal_size((120, 24)).columns)
        rows = self.rows()
        n = len(self.HEADER) - 1
        w = [max(len(r[i]) for r in rows + [self.HEADER]) for i in range(n)]
        indent = sum(w) + 2 * n
        room = max(30, width - indent)
        lines = []
        for r in [self.HEADER] + rows:
            reason = textwrap.wrap(r[n], room, break_on_hyphens=False) or [""]
            if len(reason) > MAX_REASON_LINES:
                where = f"--report {report}" if report else "--report FILE.md (or --json)"
                reason = reason[:MAX_REASON_LINES] + textwrap.wrap(f"[cut: the full reason is in {where}]", room)
            lines.append("  ".join(r[i].ljust(w[i]) for i in range(n)) + "  " + reason[0])
            lines += [" " * indent + more for more in reason[1:]]
        return "\n".join(line.rstrip() for line in lines)

    def size_notes(self, vocab_option: str = "--vocab", dim_option: str = "--dim") -> list[str]:
        """One line per check left inconclusive because this run's V x D is below the size the checks'
        resolution is set for, naming that size; [] at that size or above."""
        if self.vocab >= FULL_VOCAB and self.dim >= FULL_DIM:
            return []
        size = f"{vocab_option} {max(self.vocab, FULL_VOCAB)} {dim_option} {max(self.dim, FULL_DIM)}"
        return [f"{c.name}: inconclusive at V={self.vocab}, D={self.dim}, smaller than the V={FULL_VOCAB}, "
                f"D={FULL_DIM} the checks are set for; run with {size} to resolve it"
                for c in self.checks if c.verdict == "inconclusive" and any(w in c.reason for w in UNRESOLVED)]

    def markdown(self) -> str:
        out = [f"# pitcheck validate: {self.target}", "",
               f"dtype {self.dtype}, device {self.device}, V={self.vocab}, D={self.dim}, {self.steps} trajectory "
               f"steps, seed {self.seed}. Ratios are errors in units of u = 2^-p of {self.dtype} (times cond(T) "
               "where theory puts it); a ratio above the threshold fails.", "",
               f"**{self.summary()}**", ""]
        if self.fatal:
            out += [f"Target error: {self.fatal}", ""]
        out += ["| " + " | ".join(self.HEADER) + " |", "|---" * len(self.HEADER) + "|"]
        for r in self.rows():
            out.append("| " + " | ".join(x.replace("|", "\\|") for x in r) + " |")
        return "\n".join(out) + "\n"

    def junit(self) -> str:
        """One JUnit suite: a case per check (inconclusive is skipped), and a `target` case in error first
        when the target could not be run."""
        suite = f"pitcheck.validate[{self.target}-{self.dtype}]"
        cases = [Case(suite, "target", outcome=Outcome(ERROR, self.fatal))] if self.fatal else []
        for c in self.checks:
            if c.verdict == "fail":
                msg = f"{c.reason} (ratio {_fmt(c.value)}, threshold {_fmt(c.threshold)})"
                outcome = Outcome(FAILURE, msg, text=msg)
            elif c.verdict == "error":
                outcome = Outcome(ERROR, c.reason)
            elif c.verdict == "inconclusive":
                outcome = Outcome(SKIPPED, "inconclusive: " + c.reason)
            else:
                outcome = None
            cases.append(Case(suite, c.name, outcome=outcome))
        return junit_xml([Suite(suite, cases, seconds=self.seconds)]).decode() + "\n"

    def write(self, json_path: str | None = None, report: str | None = None, junit: str | None = None) -> None:
        for path, text in ((json_path, lambda: json.dumps(self.to_json(), indent=2) + "\n"),
                           (report, self.markdown), (junit, self.junit)):
            if path:
                write_atomic(Path(path), text().encode())


def check_output_path(path: str | None, option: str) -> None:
    """Refuse an output path that cannot be written before the validation runs, not after."""
    if path:
        check_out_file(path, option)


def check_outputs(json_path: str | None = None, report: str | None = None, junit: str | None = None,
                  target=None) -> None:
    """Every output of a validation, before it runs: each writable, no two naming one file, none naming
    the target's own source file."""
    outputs = (("--json", json_path), ("--report", report), ("--junit", junit))
    check_distinct_outputs(outputs)
    check_outputs_spare_inputs(outputs, [("the target's source file", target_source(target))])
    for option, path in outputs:
        check_output_path(path, option)


def _fmt(x) -> str:
    if x is None:
        return "-"
    x = float(x)
    return f"{x:.3g}" if math.isfinite(x) else str(x)
