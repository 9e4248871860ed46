"""Size budgets of shipped code and of the workshop (ops/): a module of at most
400 lines, a function of at most 60. `over_budget` measures source text with `ast`, so tests can run it on this tree and
on a planted violation alike."""

from __future__ import annotations

import ast
from pathlib import Path

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
PACKAGES = ("runtime", "actors", "api", "ops")


def over_budget(source: str, name: str) -> list[str]:
    """What in one module's source is over budget, one line each (empty: nothing)."""
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{name}: {lines} lines (module budget {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - start + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{name}:{node.lineno} {node.name}: {length} lines (function budget {MAX_FUNCTION_LINES})")
    return found


def shipped_modules(root: Path) -> list[Path]:
    return sorted(p for package in PACKAGES for p in (root / package).rglob("*.py"))
