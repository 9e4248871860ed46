"""ruff over runtime/, actors/, api/, ops/ and tests/ with the project's rules (pyproject.toml
[tool.ruff]), and proof that it fails on a planted violation."""

from __future__ import annotations

from pathlib import Path

from tests.support import ROOT
from tests.support.checks import ruff


def test_the_tree_passes_ruff() -> None:
    result = ruff()
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_fails_on_a_planted_violation(tmp_path: Path) -> None:
    source = (ROOT / "api" / "http" / "shared" / "sse.py").read_text()
    clean = tmp_path / "clean.py"
    clean.write_text(source)
    planted = tmp_path / "planted.py"
    planted.write_text(source.replace("import msgspec\n", "import msgspec\nimport os\n", 1) + "\n\ndef stop() -> None:\n    return undefined_name\n")
    assert ruff(str(clean)).returncode == 0  # the copy itself is clean: only the plant fails
    result = ruff(str(planted))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "F401" in result.stdout and "F821" in result.stdout, result.stdout
