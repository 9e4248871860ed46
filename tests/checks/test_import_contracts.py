"""The import contracts in pyproject.toml [tool.importlinter] hold, and each one breaks when a
violating import is planted in a copy of the packages:
- layers: api over actors over runtime (runtime/engine.py, the wiring, is the one exception);
- api never imports actors;
- the surfaces (api.openai, api.azure, api.databricks) are independent of each other;
- the shared HTTP layer never imports a surface;
- no import cycles inside a package."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checks.tools import copy_tree, lint_imports, plant


def test_the_contracts_hold() -> None:
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


PLANTED = [
    pytest.param({"runtime/sampling.py": "import actors.blocks"}, "Layers: api over actors over runtime", id="runtime-imports-actors"),
    pytest.param({"api/openai/completions.py": "import actors.tokenizer"}, "api never imports actors", id="api-imports-actors"),
    pytest.param({"api/azure/routes.py": "import api.openai.chat"}, "The surfaces are independent of each other", id="surface-imports-surface"),
    pytest.param({"api/http/body.py": "import api.databricks.endpoints"}, "The shared HTTP layer never imports a surface", id="http-imports-surface"),
    pytest.param(
        {"api/http/sse.py": "import api.http.routes", "api/http/routes.py": "import api.http.sse"},
        "No import cycles inside a package",
        id="cycle",
    ),
]


@pytest.mark.parametrize(("plants", "contract"), PLANTED)
def test_a_planted_import_breaks_its_contract(tmp_path: Path, plants: dict[str, str], contract: str) -> None:
    tree = copy_tree(tmp_path)
    for module, line in plants.items():
        plant(tree / module, line)
    result = lint_imports(cwd=tree)
    assert result.returncode == 1, result.stdout + result.stderr
    broken = [line for line in result.stdout.splitlines() if " BROKEN" in line]
    assert any(line.startswith(contract) for line in broken), result.stdout
