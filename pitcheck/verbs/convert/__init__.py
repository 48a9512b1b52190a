"""`pitcheck convert` (verb.py): a tied table to PIT's form in a conversion mode, with its certificate; and
the real-model study of the modes on SmolLM2-135M: continued pretraining under a tied, an untied or a PIT
head (continued.py), a scaled mode's logit scale fitted on held-out text (calibrate.py), the study's runs,
table and figure (study.py).
"""
from .verb import convert

__all__ = ["convert"]
