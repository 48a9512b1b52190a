"""The test tiers name real modules: a module renamed or removed must leave the end-to-end list too, or the
fast tier would silently grow by its replacement."""
from pathlib import Path

import conftest

ROOT = Path(__file__).resolve().parents[1]


def test_every_end_to_end_module_exists():
    modules = {p.stem for folder in ("tests", "stress") for p in (ROOT / folder).glob("test_*.py")}
    assert conftest.E2E_MODULES <= modules, sorted(conftest.E2E_MODULES - modules)
