"""pitcheck: numerical stress tests and verification for Pseudo-Inverse Tying (PIT).

The public API, one function per question (each has a docstring; the CLI verbs call exactly these):

    pitcheck.run(pitcheck.RunConfig(...), out)   one trajectory into a crash-safe run directory
    pitcheck.compare(out, grid)                  which retraction, in which precision, at what cost
    pitcheck.stress(files)                       do drift budgets hold (CI scenarios)
    pitcheck.bench(...)                          cost as ratios to a GEMM floor measured in the same run
    pitcheck.validate("module:factory", dtype)   is a third-party PIT implementation correct
    pitcheck.convert("smollm2", out, mode=...)   a pretrained tied table in PIT's form, with its certificate
    pitcheck.metrics, pitcheck.retractions, pitcheck.formats: the numerical core

Errors in input are PitcheckError. Names are resolved on first use: `import pitcheck` stays light (no numpy
or torch), so that the CLI's Ctrl-C handler is in place before the heavy imports start.
"""
from __future__ import annotations

import importlib

from .infra.errors import PitcheckError

__version__ = "0.1.0"

# public name -> (module, attribute in it; None: the module itself)
_API = {
    "run": ("trajectory", "run"),
    "RunConfig": ("trajectory", "RunConfig"),
    "compare": ("verbs.compare", "compare"),
    "stress": ("verbs.stress", "stress"),
    "bench": ("verbs.bench.benchmark", "bench"),
    "validate": ("verbs.validate", None),  # the subpackage, callable as the function (verbs/validate/__init__.py)
    "convert": ("verbs.convert", "convert"),
    "metrics": ("numerics.metrics", None),
    "retractions": ("model.retractions", None),
    "formats": ("numerics.formats", None),
}

__all__ = ["PitcheckError", "__version__", *_API]


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attribute = _API[name]
    module = importlib.import_module(f".{module_name}", __name__)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
