"""The command line refuses bad input at once: one line naming the flag, exit status 2.

`switchyard serve --model /nonexistent` and `--port P` with P taken used to load every model
first and end in a traceback (FileNotFoundError; an exception group ending in OSError
Errno 98). Each test runs the real CLI in a subprocess on this worktree's code, and checks
that the process never imported torch or transformers: no model was loaded.
"""

from __future__ import annotations

import os
import socket
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


def test_missing_model_directory_fails_at_once(tmp_path: Path) -> None:
    proc = run_cli("serve", "--model", "/nonexistent", "--no-embeddings", tmp_path=tmp_path)
    assert_one_line_usage_error(proc, "--model", "/nonexistent")


def test_directory_without_a_model_fails_at_once(tmp_path: Path) -> None:
    proc = run_cli("serve", "--model", str(tmp_path), tmp_path=tmp_path)
    assert_one_line_usage_error(proc, "--model", "config.json")


def test_port_in_use_fails_before_loading_models(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli("serve", "--host", "127.0.0.1", "--port", str(port), tmp_path=tmp_path)
    assert_one_line_usage_error(proc, "--port", str(port), "in use")


def test_model_in_config_file_is_checked_by_name(tmp_path: Path) -> None:
    config = tmp_path / "switchyard.toml"
    config.write_text('[[models]]\nname = "a"\nmodel = "/nonexistent/model"\n')
    proc = run_cli("serve", "--config", str(config), tmp_path=tmp_path)
    assert_one_line_usage_error(proc, str(config), "models[0].model", "/nonexistent/model")


def test_bad_config_file_keeps_failing_the_same_way(tmp_path: Path) -> None:
    config = tmp_path / "switchyard.toml"
    config.write_text("[server]\nport = 1\n")
    proc = run_cli("serve", "--config", str(config), tmp_path=tmp_path)
    assert_one_line_usage_error(proc, str(config), "unknown top-level entries")
