"""Running the real `switchyard` command line in a subprocess, and what a usage error looks like."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT

# main() with the given argv; whatever happens, stdout then says which heavy modules loaded.
RUN_CLI = """
import sys
from api.process.main import main
try:
    main(sys.argv[1:])
finally:
    print(sorted(m for m in ("torch", "transformers") if m in sys.modules), flush=True)
"""


def run_cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SWITCHYARD_STATE_DIR": str(tmp_path), "SWITCHYARD_API_KEYS": ""}
    return subprocess.run([sys.executable, "-c", RUN_CLI, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def assert_one_line_usage_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert all(word in lines[0] for word in words), lines[0]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout  # no torch: no model was loaded
