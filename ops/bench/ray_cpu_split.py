"""Where does the CPU go when one replica serves behind Ray? Each process's share of the cores
during a streaming c=16 sweep, for serve-ray's topologies and plain `switchyard serve`.

    PYTHONPATH=$PWD python -m ops.bench.ray_cpu_split [--servers direct,relay,plain] [--requests 48] [--out PATH]

For each server in turn (one replica, --replica-cpus 1, the model's torch threads as given):
a short warmup, then the sweep, with every process's user+system CPU time read from /proc
before and after; reported as cores (CPU seconds / wall seconds) per kind of process (the
replica, the ingress, Ray's proxy, controller, GCS, ...) and as the model process's CPU
milliseconds per output token, the figure that tells Ray's work inside the replica's own
process from the model's. Linux only. Run it alone: every process on the machine is counted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from ops.harness.load import sweep, switchyard_target
from ops.harness.prompts import PROMPT_TOKENS, build_prompts, default_model_dir
from ops.harness.results import cpu_model, log, start_run, write_results
from ops.harness.servers import DEFAULT_SERVED_NAME, switchyard_server

SERVED = DEFAULT_SERVED_NAME

SERVERS: dict[str, tuple[str, list[str]]] = {
    "direct": ("serve-ray", ["--replicas", "1", "--replica-cpus", "1", "--topology", "direct"]),
    "relay": ("serve-ray", ["--replicas", "1", "--replica-cpus", "1", "--topology", "relay"]),
    "plain": ("serve", []),
}
# Process kinds, by a piece of their command line; the model's process is the first found.
KINDS = ("SwitchyardReplica", "switchyard serve ", "SwitchyardIngress", "ProxyActor", "ServeController", "gcs_server", "raylet", "DashboardAgent", "EndpointConfig")
MODEL_KINDS = ("SwitchyardReplica", "switchyard serve ")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_times() -> dict[str, tuple[str, float]]:
    """pid -> (command line, user+system CPU seconds) for every process."""
    out: dict[str, tuple[str, float]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline") as f:
                cmd = f.read().replace("\0", " ")
        except OSError:
            continue
        out[pid] = (cmd, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
    return out


def kind(cmd: str) -> str:
    return next((k.strip() for k in KINDS if k in cmd), "other")


def measure(name: str, prompts: list[str], args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    command, extra = SERVERS[name]
    server_args = [*extra, "--no-embeddings", "--num-threads", str(args.threads), "--log-level", "warning"]
    with switchyard_server(log_dir / f"{name}.log", server_args, args.startup_timeout, command=command) as srv:
        target = switchyard_target(srv.base_url, SERVED)
        common: dict[str, Any] = dict(warmup_requests=0, expected_prompt_tokens=PROMPT_TOKENS)
        asyncio.run(sweep(target, prompts[:2], [2], requests_per_slot=1, min_requests=2, **common))
        before, started = cpu_times(), time.monotonic()
        level = asyncio.run(sweep(target, prompts[2:], [16], requests_per_slot=1, min_requests=args.requests, **common))["levels"][0]
        after, wall = cpu_times(), time.monotonic() - started
    cores: dict[str, float] = {}
    for pid, (cmd, seconds) in after.items():
        used = seconds - before.get(pid, (cmd, 0.0))[1]
        if used > 0:
            cores[kind(cmd)] = cores.get(kind(cmd), 0.0) + used / wall
    model_cores = next((cores[k.strip()] for k in MODEL_KINDS if k.strip() in cores), None)
    tok_s = level["output_tok_s"]
    return {
        "tok_s": tok_s, "wall_s": round(wall, 1), "errors": level["errors"],
        "cores": {k: round(v, 3) for k, v in sorted(cores.items(), key=lambda kv: -kv[1])},
        "model_process_cpu_ms_per_token": round(1000 * model_cores / tok_s, 2) if model_cores and tok_s else None,
    }  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    lines = [f"CPU: {result['cpu']} ({result['cpu_count']} cores); c=16, {result['requests']} requests", "",
             "| server | tok/s | model process ms CPU/token | cores by process |", "|---|---:|---:|---|"]  # fmt: skip
    for name, r in result["servers"].items():
        split = ", ".join(f"{k} {v}" for k, v in r["cores"].items() if v >= 0.01)
        lines.append(f"| {name} | {r['tok_s']} | {r['model_process_cpu_ms_per_token']} | {split} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="direct,relay,plain", help=f"comma-separated, of {sorted(SERVERS)}")
    p.add_argument("--requests", type=int, default=48, help="requests in the c=16 sweep")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    names = [n for n in args.servers.split(",") if n]
    if unknown := sorted(set(names) - set(SERVERS)):
        raise SystemExit(f"unknown servers {unknown}; known: {sorted(SERVERS)}")
    out_path, log_dir = start_run(args.out, "ray-cpu-split-")
    started = time.monotonic()
    prompts = build_prompts(str(default_model_dir()), args.requests + 2, PROMPT_TOKENS, "unique")
    result: dict[str, Any] = {"argv": sys.argv[1:] if argv is None else argv, "cpu": cpu_model(), "cpu_count": os.cpu_count(), "requests": args.requests, "servers": {}}
    for name in names:
        result["servers"][name] = measure(name, prompts, args, log_dir)
        log(f"[{name}] {result['servers'][name]}")
    write_results(result, out_path, started, markdown)


if __name__ == "__main__":
    main()
