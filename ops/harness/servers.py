"""Switchyard for a measurement: `switchyard serve` (or `serve-ray`) as a subprocess on a free
loopback port, or the whole stack in-process; and what its log says.

    with switchyard_server(log_dir / "switchyard.log", ["--log-level", "info"]) as srv:
        httpx.post(srv.base_url + "/v1/embeddings", ...)

The subprocess runs in its own process group (processes.ServerProcess: hub and telemetry
off), is waited on (bounded) until GET /health = 200, and is stopped on exit (SIGTERM, SIGKILL
after `term_timeout`). Serving-endpoint definitions go to a state directory of the run's own
(beside the log), so a benchmark neither reads nor writes the model store's database. It runs
this checkout's code, not whichever one the shared venv's editable install points at; where
the interpreter has no `switchyard` script beside it (a GPU machine's image, the package not
installed: ops/gpu/check.sh), it runs `python -m api.process.main` from the checkout instead.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.harness.processes import ServerProcess, free_port
from ops.harness.results import REPO_ROOT

VENV_BIN = Path(sys.executable).parent
DEFAULT_SERVED_NAME = "smollm2-135m-instruct"  # the embedded default chat model's served name

_DTYPE_RE = re.compile(r"dtype[\"']?\s*[=:]\s*[\"']?(?:torch\.)?(bfloat16|float32|float16)")


def server_dtype_from_log(text: str, served_name: str | None = None) -> str | None:
    """The dtype the server says it picked for the chat model (its runtime_ready log line).

    The server logs one runtime_ready line per model (an embedding model too); the line that
    names `served_name` wins, else the first one.
    """
    found: list[tuple[bool, str]] = []
    for line in text.splitlines():
        if "runtime_ready" in line:
            m = _DTYPE_RE.search(line)
            if m:
                found.append((served_name is not None and served_name in line, m.group(1)))
    for named, dtype in found:
        if named:
            return dtype
    return found[0][1] if found else None


def model_server_args(model: str | None, served_name: str | None = None) -> tuple[list[str], str]:
    """The `switchyard serve` arguments that serve `model` (a local model directory or GGUF
    file; None: the server's default, the embedded model) and the requests' model field for it:
    the directory's name (a file's stem), as the server names it, unless `served_name` says."""
    if model is None:
        return [], served_name or DEFAULT_SERVED_NAME
    model_dir = Path(model).resolve()
    return ["--model", str(model_dir)], served_name or (model_dir.stem if model_dir.suffix == ".gguf" else model_dir.name)


def switchyard_command() -> list[str]:
    """The `switchyard` command: the script beside this interpreter, else its module."""
    script = VENV_BIN / "switchyard"
    return [str(script)] if script.exists() else [sys.executable, "-m", "api.process.main"]


@dataclass
class RunningServer:
    base_url: str
    cmd: list[str]
    log_path: Path
    process: ServerProcess
    startup_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    def dtype(self, served_name: str) -> str | None:
        """The dtype the server logged for `served_name` in its runtime_ready line."""
        return server_dtype_from_log(self.process.tail(200_000), served_name)

    def log_tail(self, n_bytes: int = 200_000) -> str:
        return self.process.tail(n_bytes)


LAST_GRAPH = "few-token graph"  # decode_graph.py compiles the one-row graph, the rows graphs, then this one, each logging "compiled"


def wait_background_compile(process: ServerProcess, timeout: float) -> float | None:
    """A server compiling its graphs in the background (--compile) serves eager until each is
    swapped in: measure the compiled server, not that window. Seconds waited after /health
    (None: nothing was compiling)."""
    started = time.monotonic()
    if not _logged(process.tail(400_000), "background"):  # decode_graph.py's "compiling" lines
        return None
    while True:
        log = process.tail(400_000)
        last_in = any(LAST_GRAPH in line and _logged(line, "swapped_in") for line in log.splitlines())
        if last_in or "compile_failed" in log or time.monotonic() - started > timeout:
            return round(time.monotonic() - started, 1)
        time.sleep(0.5)


def _logged(log: str, flag: str) -> int:
    """How often `flag` is logged true, in the console's (`flag=True`) or JSON's (`"flag": true`) form."""
    return log.count(f"{flag}=True") + log.count(f'"{flag}": true')


@contextmanager
def switchyard_server(
    log_path: Path, server_args: Sequence[str] = (), startup_timeout: float = 300.0, term_timeout: float = 45.0, command: str = "serve",
    checkout: Path | None = None,
) -> Iterator[RunningServer]:
    """`command`: "serve", or "serve-ray" (a local Ray instance in the server's process group).
    `checkout`: another checkout's code (an earlier commit's worktree) on this interpreter."""
    port = free_port()
    state_dir = log_path.parent / "state"
    state_dir.mkdir(parents=True, exist_ok=True)
    root = checkout or REPO_ROOT
    program = [sys.executable, "-m", "api.process.main"] if checkout else switchyard_command()
    cmd = [*program, command, "--host", "127.0.0.1", "--port", str(port), "--state-dir", str(state_dir), *server_args]
    print(f"[switchyard] starting: {' '.join(cmd)} (log {log_path})", file=sys.stderr, flush=True)
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    process = ServerProcess("switchyard", cmd, log_path, env={"PYTHONPATH": path}, cwd=str(root))
    server = RunningServer(f"http://127.0.0.1:{port}", cmd, log_path, process)
    try:
        server.startup_s = round(process.wait_healthy(server.base_url + "/health", startup_timeout), 2)
        server.info["compile_s_after_health"] = wait_background_compile(process, startup_timeout)
        yield server
    finally:
        server.info["exit_code"] = process.stop(term_timeout=term_timeout)


@dataclass
class InProcessServer:
    """The whole stack in this process (Runtime + HTTP edge), for counters only the runtime has."""

    base_url: str
    runtime: Any
    stop: Any  # a trio.Event: set it to stop the server


async def in_process_server(nursery: Any, config: Any) -> InProcessServer:
    """Start the HTTP edge over one runtime built from `config` (a RuntimeConfig, port 0 for a
    free one) in `nursery`, as the test suite does; returns once it listens."""
    from functools import partial

    import trio

    from actors.build import build_engine
    from api.process.server import serve_runtime

    runtimes: list[Any] = []
    stop = trio.Event()

    def factory(cfg: Any) -> Any:
        runtimes.append(build_engine(cfg))
        return runtimes[-1]

    binds = await nursery.start(partial(serve_runtime, config, factory, stop.wait))
    return InProcessServer(base_url=binds[0], runtime=runtimes[0], stop=stop)


def step_lines(log_path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The scheduler's debug `step` lines written since `offset`, and the new offset."""
    with open(log_path, "rb") as f:
        f.seek(offset)
        data = f.read()
    data = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next call
    steps = []
    for line in data.splitlines():
        if b'"event": "step"' in line:
            try:
                steps.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return steps, offset + len(data)
