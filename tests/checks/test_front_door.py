"""The front door stays short: the README within its length, every module docstring within its
budget, no measured figure in a docstring without its results file; each check shown failing
on a planted violation (tests/support/front_door.py)."""

from __future__ import annotations

from tests.support import ROOT
from tests.support.front_door import README_MAX_LINES, docstring_problems, tree_problems


def test_the_readme_stays_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md: {lines} lines (budget {README_MAX_LINES}): move detail to docs/"


def test_module_docstrings_are_short_and_cite_their_figures() -> None:
    assert tree_problems(ROOT) == []


def test_the_checks_find_planted_violations() -> None:
    long_doc = '"""' + "\n".join(f"line {i}" for i in range(21)) + '"""\n'
    assert docstring_problems(long_doc, "long.py", 20) == ["long.py: docstring of 21 lines (budget 20)"]
    assert docstring_problems('"""Owns x.\n\nIt ran 1.9x faster (78.5 ms a step)."""\n', "fig.py", 20) == ["fig.py: docstring figures ['1.9x', '78.5 ms'] name no results file"]
    cited = '"""Owns x.\n\n1.9x faster (ops/results/planted.json)."""\n'
    assert docstring_problems(cited, "cited.py", 20) == []
    assert docstring_problems('"""Owns x; waits 60 s, answers 400s, retries 3 times."""\n', "plain.py", 20) == []
