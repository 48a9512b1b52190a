"""`pitcheck convert` (verb.py): a tied table to PIT's form in a conversion mode, with its certificate; a
scaled mode's logit scale fitted on SmolLM2's held-out text (calibrate.py, text.py).
"""
from .verb import convert

__all__ = ["convert"]
