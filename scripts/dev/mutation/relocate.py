"""Rewrite the file paths of live.json's keys and of the plants (planted.py, batched_plants.py,
stateful_plants.py) after code moves between files: each key or plant names its line text, and is given the
one file among the candidates that holds that text. Prints what it could not place.

    .venv/bin/python scripts/dev/mutation/relocate.py OLD_PATH NEW_PATH [NEW_PATH ...]
"""
from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
PLANT_FILES = ("planted.py", "batched_plants.py", "stateful_plants.py")


def holders(text: str, candidates: list[str], whole_line: bool) -> list[str]:
    out = []
    for path in candidates:
        source = (REPO / path).read_text()
        if whole_line:
            if any(line.strip() == text for line in source.splitlines()):
                out.append(path)
        elif text in source:
            out.append(path)
    return out


def relocate_live(old: str, candidates: list[str]) -> list[str]:
    path = HERE / "live.json"
    entries = json.loads(path.read_text())
    lost = []
    for entry in entries:
        file, operator, rest = entry["key"].split("|", 2)
        if file != old:
            continue
        text = rest.rsplit("|", 1)[0]
        found = holders(text, candidates, whole_line=True)
        if len(found) == 1:
            entry["key"] = "|".join([found[0], operator, rest])
        else:
            lost.append(f"live.json {entry['key']!r}: in {found or 'no file'}")
    path.write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n")
    return lost


LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"|\'((?:[^\'\\]|\\.)*)\'')


def _rewrite_path(source: str, old: str, text: str, new: str) -> tuple[str, bool]:
    """`"old",` followed by the literal of `text`, with old replaced by new (the first such place)."""
    for m in re.finditer(r'"' + re.escape(old) + r'",\s*', source):
        lit = LITERAL.match(source, m.end())
        if lit and ast.literal_eval(lit.group(0)) == text:
            return source[:m.start()] + f'"{new}",' + source[m.start() + len(old) + 3:], True
    return source, False


def relocate_plants(old: str, candidates: list[str]) -> list[str]:
    """A plant is a tuple whose file path literal is followed by its line text literal."""
    lost = []
    for name in PLANT_FILES:
        path = HERE / name
        source = path.read_text()
        scope = {}
        exec(compile(source, str(path), "exec"), scope)  # the plants are plain literals
        plants = [p for v in scope.values() if isinstance(v, list) for p in v if isinstance(p, tuple)]
        for plant in plants:
            if old not in plant:
                continue
            i = plant.index(old)
            text = plant[i + 1]
            found = holders(text, candidates, whole_line=False)
            if len(found) != 1:
                lost.append(f"{name}: {text[:60]!r} in {found or 'no file'}")
                continue
            source, placed = _rewrite_path(source, old, text, found[0])
            if not placed:
                lost.append(f"{name}: {text[:60]!r}: its path literal was not found beside it")
        path.write_text(source)
    return lost


def main(argv: list[str]) -> int:
    old, candidates = argv[0], argv[1:]
    lost = relocate_live(old, candidates) + relocate_plants(old, candidates)
    print("\n".join(lost) or "every key and plant placed")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
