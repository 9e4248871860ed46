"""mypy over the shipped packages and the workshop (runtime, actors, api, ops; [tool.mypy]), and proof
that it fails on a planted type error."""

from __future__ import annotations

from pathlib import Path

from tests.support.checks import mypy

_MODULE = '''
from runtime.sampling import SamplingParams


def budget(params: SamplingParams) -> int:
    return params.{field}
'''


def test_the_shipped_packages_type_check() -> None:
    result = mypy()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout


def test_mypy_fails_on_a_planted_type_error(tmp_path: Path) -> None:
    clean = tmp_path / "clean.py"
    clean.write_text(_MODULE.format(field="n"))  # an int: fine
    planted = tmp_path / "planted.py"
    planted.write_text(_MODULE.format(field="stop"))  # a tuple of strings, returned as an int
    ok = mypy(str(clean), cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    result = mypy(str(planted), cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Incompatible return value type" in result.stdout, result.stdout
