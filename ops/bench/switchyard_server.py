"""`switchyard serve` on a free loopback port for a benchmark, as a context manager.

    with switchyard_server(log_dir / "switchyard.log", ["--log-level", "info"]) as srv:
        httpx.post(srv.base_url + "/v1/embeddings", ...)

Starts the server in its own process group (ops.bench.procs.ServerProcess: HF_HUB_OFFLINE=1,
no telemetry), waits (bounded) for GET /health = 200, and on exit stops it (SIGTERM, SIGKILL
after `term_timeout`). Serving-endpoint definitions go to a state directory of the run's own
(beside the log), so a benchmark neither reads nor writes the model store's database.
Used by ops.bench.run, ops.bench.guided and ops.bench.embeddings.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ops.bench.procs import ServerProcess, free_port
from ops.bench.run import server_dtype_from_log

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


@dataclass
class RunningServer:
    base_url: str
    cmd: list[str]
    log_path: Path
    process: ServerProcess
    startup_s: float = 0.0
    info: dict = field(default_factory=dict)

    def dtype(self, served_name: str) -> str | None:
        """The dtype the server logged for `served_name` in its runtime_ready line."""
        return server_dtype_from_log(self.process.tail(200_000), served_name)

    def log_tail(self, n_bytes: int = 200_000) -> str:
        return self.process.tail(n_bytes)


@contextmanager
def switchyard_server(
    log_path: Path, server_args: Sequence[str] = (), startup_timeout: float = 300.0, term_timeout: float = 45.0, command: str = "serve"
) -> Iterator[RunningServer]:
    """`command`: "serve", or "serve-ray" (a local Ray instance in the server's process group)."""
    port = free_port()
    state_dir = log_path.parent / "state"
    state_dir.mkdir(parents=True, exist_ok=True)
    cmd = [str(VENV_BIN / "switchyard"), command, "--host", "127.0.0.1", "--port", str(port), "--state-dir", str(state_dir), *server_args]
    print(f"[switchyard] starting: {' '.join(cmd)} (log {log_path})", file=sys.stderr, flush=True)
    # This checkout's code, not whichever one the shared venv's editable install points at.
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    process = ServerProcess("switchyard", cmd, log_path, env={"PYTHONPATH": path}, cwd=str(REPO_ROOT))
    server = RunningServer(f"http://127.0.0.1:{port}", cmd, log_path, process)
    try:
        server.startup_s = round(process.wait_healthy(server.base_url + "/health", startup_timeout), 2)
        yield server
    finally:
        server.info["exit_code"] = process.stop(term_timeout=term_timeout)
