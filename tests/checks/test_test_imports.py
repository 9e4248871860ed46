"""The suite's own shape: tests on one axis, helpers in one place.

- Every test module sits in a tier named by what it runs (unit, engine, server, cluster, e2e,
  clients, checks); shared helpers sit in tests/support/.
- No test module or conftest imports another test module or a conftest: helpers come from
  tests.support, fixtures reach tests through pytest's conftest.py files. (A test module that
  imports another one re-runs its tests, and a fixture imported by name shadows the conftests.)
- No helper is copied: a function or class defined in two files of tests/, the same to the
  last token, is one helper to keep in tests/support/.

Each is shown failing on a planted violation in a copy of a small tree.
"""

from __future__ import annotations

import ast
import shutil
from collections import defaultdict
from pathlib import Path

from tests.support import ROOT

TIERS = {"unit", "engine", "server", "cluster", "e2e", "clients", "checks"}
OWN = {"__init__.py", "conftest.py", "support", "__pycache__", *TIERS}


def python_files(tests: Path) -> list[Path]:
    return sorted(p for p in tests.rglob("*.py") if "__pycache__" not in p.parts)


def misplaced(tests: Path) -> list[str]:
    """Entries of tests/ that are neither a tier nor the support package (or the root conftest)."""
    return sorted(p.name for p in tests.iterdir() if p.name not in OWN)


def wrong_imports(tests: Path) -> list[str]:
    """Imports of a test module or a conftest, from anywhere under `tests` (one line each)."""
    found = []
    for path in python_files(tests):
        where = path.relative_to(tests.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                found.append(f"{where}:{node.lineno} relative import (import from tests.support by name)")
                continue
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.module != "tests" else [f"tests.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                ours = parts[0] == "tests" and len(parts) > 1 and parts[1] != "support"
                bare = parts[0] == "conftest" or parts[0].startswith("test_")  # through a folder on sys.path
                if ours or bare:
                    found.append(f"{where}:{node.lineno} imports {name}")
    return found


def copied_helpers(tests: Path) -> list[str]:
    """Top-level functions and classes (tests themselves aside) defined alike in several files."""
    seen: dict[str, list[str]] = defaultdict(list)
    for path in python_files(tests):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith(("test_", "Test")):
                seen[ast.dump(node)].append(f"{path.relative_to(tests.parent)}:{node.name}")
    return sorted(", ".join(places) for places in seen.values() if len({p.split(":")[0] for p in places}) > 1)


def test_every_test_sits_in_a_tier() -> None:
    assert misplaced(ROOT / "tests") == []


def test_no_test_module_imports_another_or_a_conftest() -> None:
    assert wrong_imports(ROOT / "tests") == []


def test_no_helper_is_copied() -> None:
    assert copied_helpers(ROOT / "tests") == []


def _small_tree(tmp_path: Path) -> Path:
    tests = tmp_path / "tests"
    for package in ("", "support", "server", "unit"):
        (tests / package).mkdir(exist_ok=True)
        (tests / package / "__init__.py").write_text("")
    shutil.copy(ROOT / "tests" / "support" / "waiting.py", tests / "support" / "waiting.py")
    (tests / "server" / "conftest.py").write_text("import pytest\n\n\n@pytest.fixture\ndef thing() -> int:\n    return 1\n")
    (tests / "unit" / "test_a.py").write_text("from tests.support.waiting import in_thread\n\n\ndef helper() -> int:\n    return 2\n")
    return tests


def test_the_checks_fail_on_planted_violations(tmp_path: Path) -> None:
    tests = _small_tree(tmp_path)
    assert (misplaced(tests), wrong_imports(tests), copied_helpers(tests)) == ([], [], [])  # the tree itself is clean

    waiting = (tests / "support" / "waiting.py").read_text()
    [in_thread] = [ast.get_source_segment(waiting, n) for n in ast.parse(waiting).body if getattr(n, "name", "") == "in_thread"]
    (tests / "generation").mkdir()  # a feature folder beside the tiers
    (tests / "server" / "test_b.py").write_text(
        "from tests.server.conftest import thing\n"
        "from tests.unit.test_a import helper\n"
        "from .conftest import thing as again\n"
        "from tests import support, unit\n\n\n"
        "def test_it() -> None:\n    import tests.unit.test_a\n\n\n"
        f"{in_thread}\n"  # a copy of a support helper
    )
    (tests / "server" / "test_c.py").write_text("def helper() -> int:\n    return 2\n")
    assert misplaced(tests) == ["generation"]
    assert [line.split(" ", 1)[1] for line in wrong_imports(tests)] == [
        "imports tests.server.conftest",
        "imports tests.unit.test_a",
        "relative import (import from tests.support by name)",
        "imports tests.unit",
        "imports tests.unit.test_a",
    ]
    assert copied_helpers(tests) == [
        "tests/server/test_b.py:in_thread, tests/support/waiting.py:in_thread",
        "tests/server/test_c.py:helper, tests/unit/test_a.py:helper",
    ]
