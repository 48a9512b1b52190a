"""Importing this module registers pitcheck's built-in stateful gradient sources (stateful.STATEFUL_SOURCES): the
run reaches them through that registry and names none of them."""
from . import lm  # noqa: F401  (registers the lm source)
