"""Processes a measurement starts: a server in its own process group, a measuring tool in a
bounded subprocess, a free loopback port.

Every wait is bounded. A server runs in its own session (process group), so stopping it
signals exactly the group this module started: SIGTERM, then SIGKILL after a timeout. Nothing
a server does leaves the machine: the hub and telemetry are off in its environment.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx

# No hub look-ups, no telemetry.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1"}


def json_from_subprocess(name: str, cmd: list[str], out_file: Path, cwd: Path, timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `cmd` (which writes its JSON to `out_file`) with a timeout; its JSON, or {"error"}."""
    print(f"[{name}] {' '.join(cmd)}", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, timeout=timeout, env=None if env is None else {**os.environ, **env})
    except subprocess.TimeoutExpired:
        return {"error": f"{name} ran past {timeout:.0f}s"}
    if proc.returncode != 0 or not out_file.exists():
        return {"error": f"{name} exited {proc.returncode}"}
    try:
        result: dict[str, Any] = json.loads(out_file.read_text())
        return result
    finally:
        out_file.unlink(missing_ok=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerProcess:
    """A server subprocess in its own process group, its output in `log_path`."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: str | None = None):
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = open(log_path, "wb")
        full_env = {**os.environ, **OFFLINE_ENV, **(env or {})}
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
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=term_timeout)
            except subprocess.TimeoutExpired:
                print(f"[{self.name}] did not exit {term_timeout:.0f}s after SIGTERM; SIGKILL", file=sys.stderr, flush=True)
                self._signal(signal.SIGKILL)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        self._log.close()
        return self.proc.returncode

    def _signal(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    def tail(self, n_bytes: int = 3000) -> str:
        try:
            self._log.flush()
            data = self.log_path.read_bytes()
        except (OSError, ValueError):  # ValueError: flushing the log after stop() closed it
            return ""
        return data[-n_bytes:].decode("utf-8", "replace")

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
