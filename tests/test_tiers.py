"""The test tiers name real modules: a module renamed, moved or removed must leave the end-to-end list too, or
the fast tier would silently grow by its replacement."""
from pathlib import Path

import conftest

ROOT = Path(__file__).resolve().parents[1]


def test_every_end_to_end_module_exists():
    missing = sorted(m for m in conftest.E2E_MODULES if not (ROOT / m).is_file())
    assert not missing, missing
