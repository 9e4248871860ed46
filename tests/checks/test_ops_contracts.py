"""The workshop's import contracts (pyproject.toml, the `ops:` contracts and the one that keeps
the shipped packages off ops) each break when a violating import is planted in a copy:
- a driver imports another driver;
- the harness imports a driver, or a load tool or the GPU check imports a driver;
- an import cycle inside ops (here inside one driver's package);
- a shipped package imports ops."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checks import copy_tree, lint_imports, plant

PLANTED = [
    pytest.param({"ops/bench/overhead.py": "import ops.bench.guided"}, "ops: each driver imports only the harness", id="driver-imports-driver"),
    pytest.param({"ops/harness/load.py": "import ops.bench.overhead"}, "ops: the drivers and the load tools over the harness", id="harness-imports-driver"),
    pytest.param({"ops/load/soak.py": "import ops.bench.peers"}, "ops: the drivers and the load tools over the harness", id="load-tool-imports-driver"),
    pytest.param({"ops/gpu/report.py": "import ops.bench.step_ab"}, "ops: the drivers and the load tools over the harness", id="gpu-check-imports-driver"),
    pytest.param({"ops/bench/run/sections.py": "import ops.bench.run.report"}, "ops: no import cycles", id="cycle"),
    pytest.param({"runtime/sampling.py": "import ops.harness.stats"}, "The shipped packages never import the workshop", id="runtime-imports-ops"),
]


@pytest.mark.parametrize(("plants", "contract"), PLANTED)
def test_a_planted_import_breaks_its_ops_contract(tmp_path: Path, plants: dict[str, str], contract: str) -> None:
    tree = copy_tree(tmp_path)
    for module, line in plants.items():
        plant(tree / module, line)
    result = lint_imports(cwd=tree)
    assert result.returncode == 1, result.stdout + result.stderr
    broken = [line for line in result.stdout.splitlines() if " BROKEN" in line]
    assert any(line.startswith(contract) for line in broken), result.stdout
