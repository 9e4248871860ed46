"""The import contracts in pyproject.toml [tool.importlinter] hold, with no ignores, and each
one breaks when a violating import is planted in a copy of the packages:
- layers: api over actors over runtime (nothing points back up);
- inside api: the process over the Ray deployment over the HTTP edge;
- the HTTP edge never imports the actors (it sees an engine through runtime.protocol);
- inside the HTTP edge: the app over the surfaces (independent of each other) over the
  shared layer over platform;
- inside actors: the wiring (build, engine) over the actors over their pure cores;
- no import cycles inside a package."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.checks import copy_tree, lint_imports, plant


def test_the_contracts_hold() -> None:
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


PLANTED = [
    pytest.param({"runtime/sampling.py": "import actors.blocks"}, "Layers: api over actors over runtime", id="runtime-imports-actors"),
    pytest.param({"actors/executor.py": "import api.http.shared.sse"}, "Layers: api over actors over runtime", id="actors-import-api"),
    pytest.param({"api/http/openai/completions/view.py": "import actors.tokenizer"}, "The HTTP edge never imports the actors", id="edge-imports-actors"),
    pytest.param({"api/http/openai/models.py": "import actors.engine"}, "The HTTP edge never imports the actors", id="edge-imports-engine"),
    pytest.param({"api/http/app.py": "import api.process.server"}, "Inside api: process over cluster", id="edge-imports-process"),
    pytest.param({"api/cluster/edge.py": "import api.process.flags"}, "Inside api: process over cluster", id="cluster-imports-process"),
    pytest.param({"api/http/azure/routes.py": "import api.http.openai.chat"}, "Inside the HTTP edge", id="surface-imports-surface"),
    pytest.param({"api/http/shared/body.py": "import api.http.databricks.endpoints"}, "Inside the HTTP edge", id="shared-imports-surface"),
    pytest.param({"actors/engine.py": "import actors.build"}, "Inside actors", id="engine-imports-build"),
    pytest.param({"actors/sched_core.py": "import actors.scheduler"}, "Inside actors", id="core-imports-its-shell"),
    pytest.param(
        {"api/http/shared/sse.py": "import api.http.shared.routes", "api/http/shared/routes.py": "import api.http.shared.sse"},
        "No import cycles inside a package",
        id="cycle",
    ),
]


def test_no_contract_has_ignores() -> None:
    """An ignore is an arrow the contracts stopped checking: there are none."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    assert contracts and all(not contract.get("ignore_imports") for contract in contracts)


@pytest.mark.parametrize(("plants", "contract"), PLANTED)
def test_a_planted_import_breaks_its_contract(tmp_path: Path, plants: dict[str, str], contract: str) -> None:
    tree = copy_tree(tmp_path)
    for module, line in plants.items():
        plant(tree / module, line)
    result = lint_imports(cwd=tree)
    assert result.returncode == 1, result.stdout + result.stderr
    broken = [line for line in result.stdout.splitlines() if " BROKEN" in line]
    assert any(line.startswith(contract) for line in broken), result.stdout
