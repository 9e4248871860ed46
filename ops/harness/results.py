"""Where a run's results go and what they say about the machine.

Owns: the results directory (ops/results/, indexed in its README.md), how every driver starts
(`start_run`: the results path, the log directory, signals that unwind) and ends
(`write_results`: load average, elapsed time, the machine, the markdown table, an atomic
write), JSON in and out, waiting for a quiet machine, and the machine's description: `lscpu`'s
model name *and* /proc/cpuinfo's CPU family, because these VMs name Zen 4 (family 25) and
Zen 5 (family 26) alike ("AMD EPYC") and their speeds differ widely (ops/results/README.md).
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "ops" / "results"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def start_run(out: str | None, prefix: str) -> tuple[Path, Path]:
    """How every benchmark starts: (results path, log directory), the results by default in
    ops/results/<prefix><UTC time>.json, the repository as working directory, and
    SIGTERM/SIGHUP unwinding like Ctrl-C, so the `finally` blocks stop the servers the run
    started (they run in their own process groups and would otherwise outlive it)."""

    def _exit_on_signal(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    os.chdir(REPO_ROOT)
    out_path = Path(out) if out else RESULTS_DIR / f"{prefix}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    return out_path, out_path.parent / "logs" / out_path.stem


def write_results(result: dict[str, Any], out_path: Path, started: float, render: Callable[[dict[str, Any]], str]) -> None:
    """How every benchmark ends: load average, elapsed time and the machine, the markdown table
    (kept in the JSON too), an atomic write (an interrupted run never leaves half a file), the
    table printed."""
    result["loadavg_end"] = os.getloadavg()
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    result.setdefault("machine", machine())
    result["markdown"] = table = render(result)
    write_json(result, out_path)
    print(table)
    log(f"results: {out_path}")


def write_json(result: dict[str, Any], out_path: Path) -> None:
    """`result` as indented JSON, written atomically (a temporary file renamed over `out_path`)."""
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out_path)


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def emit_json(result: dict[str, Any], out: str | None) -> None:
    """A measuring tool's result: printed, and written to `out` when given."""
    text = json.dumps(result, indent=2)
    if out:
        Path(out).write_text(text + "\n")
    print(text)


def wait_for_quiet(max_load: float, max_wait: float, interval: float = 10.0) -> dict[str, Any]:
    """Wait (bounded) until the 1-minute load average is at most `max_load`; says how it went."""
    t0 = time.monotonic()
    for _ in range(int(max_wait / interval) + 1):
        load1 = os.getloadavg()[0]
        if load1 <= max_load:
            return {"quiet": True, "load1": load1, "waited_s": round(time.monotonic() - t0, 1)}
        if time.monotonic() - t0 >= max_wait:
            break
        log(f"[run] load average {load1:.2f} > {max_load}: waiting (up to {max_wait:.0f}s)")
        time.sleep(interval)
    return {"quiet": False, "load1": os.getloadavg()[0], "waited_s": round(time.monotonic() - t0, 1)}


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def _command_line(args: list[str], prefix: str) -> str | None:
    """The value after `prefix` on the first line of a short command's output that has it."""
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith(prefix)), None)


def cpu_model() -> str:
    """`lscpu`'s model name and the CPU family, e.g. "AMD EPYC (family 26)"."""
    fields = _cpuinfo()
    name = _command_line(["lscpu"], "Model name") or fields.get("model name") or platform.processor() or "unknown"
    return f"{name} (family {fields['cpu family']})" if "cpu family" in fields else name


def gpu_model() -> str | None:
    """The first GPU's name from nvidia-smi, None without one (torch stays unimported)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    names = out.stdout.strip().splitlines() if out.returncode == 0 else []
    return names[0].strip() if names else None


def machine() -> dict[str, Any]:
    """What the results index needs to say where a run ran."""
    family = _cpuinfo().get("cpu family")
    return {
        "cpu": cpu_model(),
        "cpu_family": int(family) if family and family.isdigit() else None,
        "cpu_count": os.cpu_count(),
        "gpu": gpu_model(),
        "platform": platform.platform(),
    }


def fmt(x: Any) -> str:
    """A table cell: '–' for nothing, one decimal from 10 up, two below."""
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"
    return str(x)


def loadavg_line(result: dict[str, Any]) -> str:
    return f"load average (1, 5, 15 min) at start {result.get('loadavg_start')}, at end {result.get('loadavg_end')} on {os.cpu_count()} CPUs"
