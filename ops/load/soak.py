"""Soak run: moderate, steady load for a bounded time while watching the server's memory.

Drives a server on 127.0.0.1 with `--concurrency` clients (chat and completions, streaming
and not, prompt mix from ops/load/prompts.py; `--disconnect-rate` of the streams are
abandoned mid-way) and samples the server process's resident memory (psutil) every
`--interval` seconds. At the end it reports the RSS just after warm-up and at the end (each
the median of 3 samples, to ride out allocator noise), the peak, the growth, and whether the
end is within `--tolerance` (5%) of after warm-up; the exit status says the same. It also checks
that the server is idle once the load stops (no live request in /metrics).

    # a server it starts itself, on the default model, stopped with SIGTERM at the end:
    .venv/bin/python -m ops.load.soak --spawn --port 8012 --duration 600
    # a server already running:
    .venv/bin/python -m ops.load.soak --url http://127.0.0.1:8000 --pid 12345 --duration 300

Bounded: --duration (default 10 minutes) plus the server's start; every request has a timeout.
A server with API keys: `--api-key KEY`, or (better: command lines are visible to other users)
the SWITCHYARD_API_KEY environment variable; it is sent as `Authorization: Bearer <key>` and
never printed. With --spawn, a key given this way is also handed to the spawned server (as
SWITCHYARD_API_KEYS) unless its environment already has keys.
Imports trio, httpx, psutil and ops.load.prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import psutil
import trio

from ops.load.prompts import draw


@dataclass
class Tally:
    ok: int = 0
    abandoned: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    completion_tokens: int = 0

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


async def client(http: httpx.AsyncClient, rng: random.Random, deadline: float, args: argparse.Namespace, tally: Tally) -> None:
    while time.monotonic() < deadline:
        prompt, max_tokens = draw(rng)
        chat = rng.random() < 0.5
        stream = rng.random() < 0.6
        path = "/v1/chat/completions" if chat else "/v1/completions"
        body: dict = {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
        body.update(max_tokens=max_tokens, stream=stream)
        if args.model:
            body["model"] = args.model
        try:
            with trio.fail_after(args.request_timeout):
                if stream:
                    await _stream(http, path, body, rng.random() < args.disconnect_rate, rng, tally)
                else:
                    r = await http.post(path, json=body)
                    if r.status_code == 200:
                        tally.ok += 1
                        tally.completion_tokens += r.json()["usage"]["completion_tokens"]
                    else:
                        tally.error(str(r.status_code))
        except (trio.TooSlowError, httpx.HTTPError) as exc:
            tally.error(type(exc).__name__)


async def _stream(http: httpx.AsyncClient, path: str, body: dict, abandon: bool, rng: random.Random, tally: Tally) -> None:
    body = {**body, "stream_options": {"include_usage": True}}
    leave_after = rng.randint(1, 8)
    async with http.stream("POST", path, json=body) as resp:
        if resp.status_code != 200:
            tally.error(str(resp.status_code))
            return
        events = 0
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            events += 1
            if abandon and events >= leave_after:
                tally.abandoned += 1
                return  # closes the connection mid-stream
            if line == "data: [DONE]":
                tally.ok += 1
                return
            payload = json.loads(line[6:])
            if "error" in payload:
                tally.error("error_event")
                return
            if payload.get("usage"):
                tally.completion_tokens += payload["usage"]["completion_tokens"]
    tally.error("stream_cut")


async def sample_memory(proc: psutil.Process, interval: float, deadline: float, start: float, samples: list[tuple[float, int]]) -> None:
    while time.monotonic() < deadline:
        rss = proc.memory_info().rss
        samples.append((round(time.monotonic() - start, 1), rss))
        print(f"t={samples[-1][0]:7.1f}s rss={rss / 2**20:8.1f} MiB", file=sys.stderr, flush=True)
        await trio.sleep(interval)


async def live_requests(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("switchyard_requests_live{"))


async def run(args: argparse.Namespace, url: str, pid: int) -> dict:
    proc = psutil.Process(pid)
    start = time.monotonic()
    deadline = start + args.duration
    samples: list[tuple[float, int]] = []
    tally = Tally()
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(base_url=url, timeout=args.request_timeout, limits=limits, headers=headers) as http:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample_memory, proc, args.interval, deadline, start, samples)
            for i in range(args.concurrency):
                nursery.start_soon(client, http, random.Random(args.seed + i), deadline, args, tally)
        with trio.move_on_after(30):
            while await live_requests(http):
                await trio.sleep(0.5)
        idle = await live_requests(http) == 0
    after_warmup = [rss for t, rss in samples if t >= args.warmup][:3]
    end = [rss for _, rss in samples][-3:]
    base, last = statistics.median(after_warmup or end), statistics.median(end)
    growth = (last - base) / base
    elapsed = time.monotonic() - start
    return {
        "duration_s": round(elapsed, 1),
        "concurrency": args.concurrency,
        "requests_ok": tally.ok,
        "streams_abandoned": tally.abandoned,
        "errors": tally.errors,
        "completion_tokens": tally.completion_tokens,
        "tokens_per_s": round(tally.completion_tokens / elapsed, 1),
        "rss_after_warmup_mib": round(base / 2**20, 1),
        "rss_end_mib": round(last / 2**20, 1),
        "rss_peak_mib": round(max(rss for _, rss in samples) / 2**20, 1),
        "rss_growth_pct": round(100 * growth, 2),
        "within_tolerance": abs(growth) <= args.tolerance,
        "idle_after": idle,
        "samples": len(samples),
    }


def spawn(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    url = f"http://127.0.0.1:{args.port}"
    cmd = [sys.executable, "-m", "api.process.main", "serve", "--port", str(args.port), *args.server_args]
    log = open(args.server_log, "wb")
    env = dict(os.environ)
    if args.api_key and not env.get("SWITCHYARD_API_KEYS"):
        env["SWITCHYARD_API_KEYS"] = args.api_key
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    end = time.monotonic() + args.start_timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}; see {args.server_log}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise SystemExit(f"server not healthy after {args.start_timeout}s; see {args.server_log}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--pid", type=int, help="the server's process id (with --url)")
    p.add_argument("--spawn", action="store_true", help="start `python -m api.process.main serve` on --port and stop it at the end")
    p.add_argument("--port", type=int, default=8012)
    p.add_argument("--server-arg", dest="server_args", action="append", default=[], help="extra `serve` argument (repeatable)")
    p.add_argument("--server-log", default="/tmp/switchyard-soak-server.log")
    p.add_argument("--start-timeout", type=float, default=300)
    p.add_argument("--duration", type=float, default=600, help="seconds of load (default 10 minutes)")
    p.add_argument("--warmup", type=float, default=60, help="seconds before the baseline sample")
    p.add_argument("--interval", type=float, default=5, help="seconds between memory samples")
    p.add_argument("--concurrency", type=int, default=6)
    p.add_argument("--disconnect-rate", type=float, default=0.1)
    p.add_argument("--request-timeout", type=float, default=120)
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--model", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--api-key", default=os.environ.get("SWITCHYARD_API_KEY"),
        help="Bearer key for a server with API keys (default: $SWITCHYARD_API_KEY; prefer the variable)",
    )
    args = p.parse_args(argv)
    if args.warmup >= args.duration:
        p.error("--warmup must be shorter than --duration")
    if not args.spawn and args.pid is None:
        p.error("--pid is required without --spawn")
    if not args.spawn and urlsplit(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        p.error("the soak target must be on the loopback interface")
    return args


def _stop(server: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM the spawned server; its exit code, or None if it had to be killed after 60 s."""
    server.send_signal(signal.SIGTERM)
    try:
        return server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        return None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    server = None
    if args.spawn:
        server, url = spawn(args)
        pid = server.pid
    else:
        url, pid = args.url, args.pid
    try:
        report = trio.run(run, args, url, pid)
    finally:
        report_rc = _stop(server) if server is not None else None
    if server is not None:
        report["server_exit_code"] = report_rc
    print(json.dumps(report, indent=2))
    ok = report["within_tolerance"] and report["idle_after"] and report.get("server_exit_code", 0) == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
