"""Running the project's static checks (ruff, mypy, import-linter) the way `make test` does:
the venv's own tools, the project's own configuration (pyproject.toml)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT

BIN = Path(sys.executable).parent
PACKAGES = ("runtime", "actors", "api", "ops")


def run(args: list[str], cwd: Path = ROOT, pythonpath: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath or cwd), "MYPYPATH": str(ROOT), "NO_COLOR": "1"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), *args], cwd)


def mypy(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *args], cwd)


def lint_imports(cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """import-linter on the packages under `cwd`, with `cwd`'s pyproject.toml contracts."""
    return run([str(BIN / "lint-imports"), "--no-cache"], cwd, pythonpath=cwd)


def copy_tree(dest: Path) -> Path:
    """The shipped packages and pyproject.toml, copied under `dest` (to plant a violation in)."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def plant(path: Path, line: str) -> None:
    """Add `line` right after a module's top-level imports."""
    lines = path.read_text().splitlines(keepends=True)
    imports = [node for node in ast.parse("".join(lines)).body if isinstance(node, (ast.Import, ast.ImportFrom))]
    at = max(node.end_lineno or node.lineno for node in imports)
    path.write_text("".join(lines[:at]) + line + "\n" + "".join(lines[at:]))
