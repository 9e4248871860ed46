"""The results index (ops/results/README.md) lists every results file and no other, and every
dated results file the repository's prose or code cites exists: a renamed or deleted file
cannot leave a dangling citation behind."""

from __future__ import annotations

import re

from tests.support import ROOT

RESULTS = ROOT / "ops" / "results"
INDEX = RESULTS / "README.md"
# A results name as the index scheme writes it: <what>-<YYYY-MM-DD>-<machine>..., .json or _stats.csv.
CITED = re.compile(r"ops/results/((?:locust/)?[A-Za-z0-9._-]*\d{4}-\d{2}-\d{2}[A-Za-z0-9._-]*\.(?:json|csv))")


def results_files() -> set[str]:
    return {str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*") if p.suffix in (".json", ".csv") and "logs" not in p.relative_to(RESULTS).parts}


def indexed() -> list[str]:
    """The file column of the index's table (the rows before the old-names table)."""
    text = INDEX.read_text().split("\nOld names")[0]
    return re.findall(r"^\| `([^`]+\.(?:json|csv))` \|", text, flags=re.MULTILINE)


def test_every_results_file_has_one_row() -> None:
    rows = indexed()
    assert sorted(rows) == sorted(results_files())
    assert len(rows) == len(set(rows))


def test_every_cited_results_file_exists() -> None:
    sources = [p for p in ROOT.rglob("*") if p.suffix in (".md", ".py") and ".venv" not in p.parts and p.is_file() and not p.is_relative_to(RESULTS)]
    missing = [f"{p.relative_to(ROOT)}: {name}" for p in sources for name in CITED.findall(p.read_text(errors="replace")) if not (RESULTS / name).exists()]
    assert missing == []
