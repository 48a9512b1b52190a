"""pitcheck: numerical stress tests and verification for Pseudo-Inverse Tying (PIT)."""
__version__ = "0.1.0"

from .errors import PitcheckError  # noqa: F401


def __getattr__(name):
    # pitcheck.validate(...) works after a bare `import pitcheck`, which stays light (no torch)
    if name == "validate":
        import importlib

        return importlib.import_module(".validate", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
