"""pitcheck: numerical stress tests and verification for Pseudo-Inverse Tying (PIT)."""
__version__ = "0.1.0"

from .errors import PitcheckError  # noqa: F401
