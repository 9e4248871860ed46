"""What keeps the front door short: the README's length, module docstrings' length, and no
measured figure in a docstring that names no results file (tests/checks/test_front_door.py).

A module docstring says what the module owns and why, in a few lines; measurements live in
results files and docs, cited by name. The workshop's drivers (ops/) may say more: their
docstring is their `--help`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

README_MAX_LINES = 220
DOCSTRING_MAX_LINES = {"runtime": 20, "actors": 20, "api": 20, "ops": 40}
# A measured figure: a ratio (1.9x) or a decimal with a unit (0.12 ms, 78.5 ms, 4.5%).
FIGURE = re.compile(r"(?<![\w.])(?:\d+(?:\.\d+)?x(?!\w)|\d+\.\d+\s?(?:ms|µs|us|s|tok/s|GB/s|%|nats)(?![\w/]))")


def docstring_problems(source: str, name: str, max_lines: int) -> list[str]:
    """What is wrong with one module's docstring, one line each (empty: nothing)."""
    doc = ast.get_docstring(ast.parse(source, name), clean=False) or ""
    found = []
    lines = len(doc.splitlines())
    if lines > max_lines:
        found.append(f"{name}: docstring of {lines} lines (budget {max_lines})")
    figures = [m.group(0) for m in FIGURE.finditer(doc)]
    if figures and "ops/results/" not in doc and ".json" not in doc:
        found.append(f"{name}: docstring figures {figures[:3]} name no results file")
    return found


def tree_problems(root: Path) -> list[str]:
    out = []
    for package, budget in DOCSTRING_MAX_LINES.items():
        for path in sorted((root / package).rglob("*.py")):
            out += docstring_problems(path.read_text(), str(path.relative_to(root)), budget)
    return out
