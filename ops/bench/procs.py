"""Start a server subprocess on a free loopback port, wait for its health check, stop it;
run a measuring tool in a bounded subprocess and read back its JSON.

Every wait is bounded. The server runs in its own session (process group), so stopping it
signals exactly the group this module started: SIGTERM, then SIGKILL after a timeout.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def json_from_subprocess(name: str, cmd: list[str], out_file: Path, cwd: Path, timeout: float) -> dict:
    """Run `cmd` (which writes its JSON to `out_file`) with a timeout; its JSON, or {"error"}."""
    import json

    print(f"[{name}] {' '.join(cmd)}", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{name} ran past {timeout:.0f}s"}
    if proc.returncode != 0 or not out_file.exists():
        return {"error": f"{name} exited {proc.returncode}"}
    try:
        return json.loads(out_file.read_text())
    finally:
        out_file.unlink(missing_ok=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, name: str, cmd: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: str | None = None):
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "wb")
        full_env = dict(os.environ)
        # Nothing leaves the machine: no hub look-ups, no telemetry.
        full_env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1"})
        full_env.update(env or {})
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=cwd, start_new_session=True)
        self.started_at = time.monotonic()

    def wait_healthy(self, url: str, timeout: float, interval: float = 0.5) -> float:
        """Poll `url` until it answers 200; returns seconds waited. Raises if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        attempts = int(timeout / interval) + 1
        for _ in range(attempts):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before it was healthy; log: {self.log_path}\n{self.tail()}")
            try:
                r = httpx.get(url, timeout=5.0)
                if r.status_code == 200:
                    return time.monotonic() - self.started_at
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                break
            time.sleep(interval)
        raise TimeoutError(f"{self.name} not healthy at {url} after {timeout:.0f}s; log: {self.log_path}\n{self.tail()}")

    def stop(self, term_timeout: float = 30.0) -> int | None:
        """SIGTERM the process group, wait up to `term_timeout`, then SIGKILL it. Returns the exit code."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=term_timeout)
            except subprocess.TimeoutExpired:
                print(f"[{self.name}] did not exit {term_timeout:.0f}s after SIGTERM; SIGKILL", file=sys.stderr, flush=True)
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        self._log.close()
        return self.proc.returncode

    def tail(self, n_bytes: int = 3000) -> str:
        try:
            self._log.flush()
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-n_bytes:].decode("utf-8", "replace")

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
