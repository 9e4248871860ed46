"""Overload benchmark: how fast does a saturated server refuse the excess?

Fires bursts of N simultaneous requests at a running server (127.0.0.1 only) over raw,
pre-opened sockets, so the client costs almost nothing, and reports, per status, the time from
sending a request to its status line (p50 / p90 / p99 / max), then checks that every admitted
request completed. Bounded: `--bursts` bursts of `--burst` requests, `--timeout` per request.

    .venv/bin/switchyard serve --port 8011 --max-pending 8 &
    .venv/bin/python -m ops.overload --url http://127.0.0.1:8011 --burst 80 --bursts 5

Imports trio and the stdlib only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from urllib.parse import urlsplit

import trio


def _request(host: str, port: int, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + payload


async def _one(stream: trio.SocketStream, request: bytes, go: trio.Event, out: list, timeout: float) -> None:
    await go.wait()
    t0 = time.perf_counter()
    status, first, head, body = 0, None, b"", b""
    with trio.move_on_after(timeout):
        await stream.send_all(request)
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = await stream.receive_some(65536)
            if not data:
                break
            buf += data
            if first is None:
                first = time.perf_counter() - t0
        head, _, body = buf.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1]) if head else 0
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), None)
        while length is not None and len(body) < length:
            data = await stream.receive_some(65536)
            if not data:
                break
            body += data
    total = time.perf_counter() - t0
    await stream.aclose()
    complete = status == 200 and b'"finish_reason":"length"' in body.replace(b" ", b"")
    out.append({"status": status, "first": first if first is not None else total, "total": total, "complete": complete, "head": head, "body": body})


async def burst(host: str, port: int, n: int, body: dict, timeout: float) -> list[dict]:
    """n requests on n fresh connections, released together; one result dict per request:
    status, first (s to the status line), total (s to the whole body), complete (a 200 whose
    body says it finished), head and body (bytes)."""
    streams = [await trio.open_tcp_stream(host, port) for _ in range(n)]
    request = _request(host, port, body)
    go = trio.Event()
    out: list[dict] = []
    async with trio.open_nursery() as nursery:
        for s in streams:
            nursery.start_soon(_one, s, request, go, out, timeout)
        await trio.sleep(0.05)
        go.set()
    return out


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summarize(results: list[dict]) -> dict:
    report: dict = {"requests": len(results)}
    for status in sorted({r["status"] for r in results}):
        lat = [r["first"] * 1000 for r in results if r["status"] == status]
        report[str(status)] = {
            "count": len(lat),
            "p50_ms": round(statistics.median(lat), 1),
            "p90_ms": round(_pct(lat, 0.90), 1),
            "p99_ms": round(_pct(lat, 0.99), 1),
            "max_ms": round(max(lat), 1),
        }
    admitted = [r for r in results if r["status"] == 200]
    report["admitted_completed"] = sum(r["complete"] for r in admitted)
    report["admitted"] = len(admitted)
    report["hung_or_failed"] = sum(1 for r in results if r["status"] not in (200, 429, 503))
    return report


async def main(args: argparse.Namespace) -> int:
    url = urlsplit(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    if host not in ("127.0.0.1", "localhost", "::1"):
        print("refusing a non-loopback target", file=sys.stderr)
        return 2
    body = {"prompt": args.prompt, "max_tokens": args.max_tokens, "ignore_eos": True}
    results: list[dict] = []
    for i in range(args.bursts):
        results += await burst(host, port, args.burst, body, args.timeout)
        await trio.sleep(args.pause)
    report = summarize(results)
    print(json.dumps(report, indent=2))
    ok = report["hung_or_failed"] == 0 and report["admitted_completed"] == report["admitted"]
    return 0 if ok else 1


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--burst", type=int, default=80, help="simultaneous requests per burst (10x --max-pending is the issue's case)")
    p.add_argument("--bursts", type=int, default=5)
    p.add_argument("--pause", type=float, default=2.0, help="seconds between bursts")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--prompt", default="The quick brown fox jumps over the lazy dog.")
    p.add_argument("--timeout", type=float, default=120.0, help="per request")
    sys.exit(trio.run(main, p.parse_args()))


if __name__ == "__main__":
    cli()
