"""Overload benchmark: how fast does a saturated server refuse the excess?

Fires bursts of N simultaneous requests at a running server (127.0.0.1 only) over raw,
pre-opened sockets, so the client costs almost nothing, and reports, per status, the time from
sending a request to its status line (p50 / p90 / p99 / max), then checks that every admitted
request completed. Bounded: `--bursts` bursts of `--burst` requests, `--timeout` per request.

The target: the excess gets its 429 (or 503) within 50 ms. Two figures:
- `refusal_p99_ms`: over the bursts. All N arrive at once and one event loop answers them one
  after another (on a 2-core machine shared with the device thread and this client), so the
  tail is the whole burst's queue, not one refusal's cost;
- `saturated_sequential` (with `--probe K`): the server held full by `--fill` long requests,
  K requests sent one at a time: what one refusal costs while the device works.
`refusals_within_target` judges the sequential p99 when probed, else the burst p99; the exit
status is 0 only when no request hung or failed, every admitted one completed, and that p99
is within the target (`--target-ms`).

    .venv/bin/switchyard serve --port 8011 --max-pending 8 &
    .venv/bin/python -m ops.load.overload --url http://127.0.0.1:8011 --burst 80 --bursts 5
    # another generation route; a server with API keys:
    SWITCHYARD_API_KEY=sk-... .venv/bin/python -m ops.load.overload --route azure --url http://127.0.0.1:8011

`--route`: completions (default), chat, responses, embeddings, azure (POST /chat/completions
?api-version=...), invocations (POST /serving-endpoints/{--endpoint}/invocations).
`--api-key` (default: the SWITCHYARD_API_KEY environment variable) is sent as
`Authorization: Bearer <key>`; it is never printed.

Imports trio and the stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from urllib.parse import urlsplit

import trio

TARGET_MS = 50.0  # the excess gets a 429 (or 503 with Retry-After) within 50 ms
AZURE_API_VERSION = "2024-05-01-preview"
# route -> (path template, body kind, what a completed admitted response's body contains)
ROUTES = {
    "completions": ("/v1/completions", "prompt", b'"finish_reason":"length"'),
    "chat": ("/v1/chat/completions", "messages", b'"finish_reason":"length"'),
    "responses": ("/v1/responses", "input", b'"object":"response"'),
    "embeddings": ("/v1/embeddings", "embed", b'"object":"list"'),
    "azure": (f"/chat/completions?api-version={AZURE_API_VERSION}", "messages", b'"finish_reason":"length"'),
    "invocations": ("/serving-endpoints/{endpoint}/invocations", "messages", b'"finish_reason":"length"'),
}


def route_request(route: str, prompt: str, max_tokens: int, endpoint: str = "", model: str | None = None) -> tuple[str, dict, dict[str, str], bytes]:
    """(path, body, extra headers, completion marker) of one request to `route`."""
    template, kind, marker = ROUTES[route]
    headers: dict[str, str] = {}
    if kind == "prompt":
        body: dict = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    elif kind == "messages":
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "ignore_eos": True}
    elif kind == "input":
        body = {"input": prompt, "max_output_tokens": max_tokens}
    else:
        body = {"input": [prompt]}
    if route == "azure":
        headers["extra-parameters"] = "pass-through"  # ignore_eos is not in Azure's request table
    if model:
        body["model"] = model
    return template.format(endpoint=endpoint), body, headers, marker


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _request(host: str, port: int, body: dict, path: str = "/v1/completions", headers: dict[str, str] | None = None) -> bytes:
    payload = json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + payload


async def _one(stream: trio.SocketStream, request: bytes, go: trio.Event, out: list, timeout: float, marker: bytes = ROUTES["completions"][2]) -> None:
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
    complete = status == 200 and marker in body.replace(b" ", b"")
    out.append({"status": status, "first": first if first is not None else total, "total": total, "complete": complete, "head": head, "body": body})


async def burst(
    host: str, port: int, n: int, body: dict, timeout: float,
    path: str = "/v1/completions", headers: dict[str, str] | None = None, marker: bytes = ROUTES["completions"][2],
) -> list[dict]:
    """n requests on n fresh connections, released together; one result dict per request:
    status, first (s to the status line), total (s to the whole body), complete (a 200 whose
    body has `marker`: it finished), head and body (bytes)."""
    streams = [await trio.open_tcp_stream(host, port) for _ in range(n)]
    request = _request(host, port, body, path, headers)
    go = trio.Event()
    out: list[dict] = []
    async with trio.open_nursery() as nursery:
        for s in streams:
            nursery.start_soon(_one, s, request, go, out, timeout, marker)
        await trio.sleep(0.05)
        go.set()
    return out


async def saturated_probe(
    host: str, port: int, body: dict, long_body: dict, path: str, headers: dict[str, str], marker: bytes, fill: int, n: int, timeout: float
) -> dict:
    """Hold the server full with `fill` requests of `long_body`; send `n` of `body` one at a time."""
    results: list[dict] = []
    async with trio.open_nursery() as nursery:
        for _ in range(fill):
            nursery.start_soon(burst, host, port, 1, long_body, timeout, path, headers, marker)
        await trio.sleep(1.0)  # admitted and running
        for _ in range(n):
            results += await burst(host, port, 1, body, timeout, path, headers, marker)
        nursery.cancel_scope.cancel()
    refusals = [r["first"] * 1000 for r in results if r["status"] in (429, 503)]
    out: dict = {"requests": n, "refused": len(refusals), "fill": fill}
    if refusals:
        out.update(p50_ms=round(statistics.median(refusals), 2), p99_ms=round(_pct(refusals, 0.99), 2), max_ms=round(max(refusals), 2))
    return out


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summarize(results: list[dict], target_ms: float = TARGET_MS) -> dict:
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
    refusals = [r["first"] * 1000 for r in results if r["status"] in (429, 503)]
    report["refusal_target_ms"] = target_ms
    report["refusal_p99_ms"] = round(_pct(refusals, 0.99), 1) if refusals else None
    report["refusals_within_target"] = bool(refusals) and _pct(refusals, 0.99) <= target_ms
    return report


async def main(args: argparse.Namespace) -> int:
    url = urlsplit(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    if host not in ("127.0.0.1", "localhost", "::1"):
        print("refusing a non-loopback target", file=sys.stderr)
        return 2
    if args.route == "invocations" and not args.endpoint:
        print("--route invocations needs --endpoint", file=sys.stderr)
        return 2
    if args.probe and args.route == "embeddings":
        print("--probe needs a generation route: embeddings finish at once and cannot hold the server full", file=sys.stderr)
        return 2
    path, body, headers, marker = route_request(args.route, args.prompt, args.max_tokens, args.endpoint or "", args.model)
    headers.update(auth_headers(args.api_key))
    results: list[dict] = []
    for _ in range(args.bursts):
        results += await burst(host, port, args.burst, body, args.timeout, path, headers, marker)
        await trio.sleep(args.pause)
    report = {"route": args.route, "path": path, **summarize(results, args.target_ms)}
    if args.probe:
        # the route's own long body: each surface names its length field differently
        long_body = route_request(args.route, args.prompt, 512, args.endpoint or "", args.model)[1]
        probe = await saturated_probe(host, port, body, long_body, path, headers, marker, args.fill, args.probe, args.timeout)
        report["saturated_sequential"] = probe
        report["refusals_within_target"] = probe["refused"] == args.probe and probe.get("p99_ms", 1e9) <= args.target_ms
    print(json.dumps(report, indent=2))
    ok = report["hung_or_failed"] == 0 and report["admitted_completed"] == report["admitted"] and report["refusals_within_target"]
    return 0 if ok else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--burst", type=int, default=80, help="simultaneous requests per burst (80: 10x a --max-pending of 8)")
    p.add_argument("--bursts", type=int, default=5)
    p.add_argument("--pause", type=float, default=2.0, help="seconds between bursts")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--prompt", default="The quick brown fox jumps over the lazy dog.")
    p.add_argument("--timeout", type=float, default=120.0, help="per request")
    p.add_argument("--route", choices=sorted(ROUTES), default="completions", help="which generation route to overload")
    p.add_argument("--endpoint", default=None, help="the serving endpoint of --route invocations")
    p.add_argument("--model", default=None, help="the body's model (default: the server's default)")
    p.add_argument("--target-ms", type=float, default=TARGET_MS, help="p99 refusal latency to meet (ms)")
    p.add_argument("--probe", type=int, default=0, help="then send this many requests one at a time to the server held full")
    p.add_argument("--fill", type=int, default=8, help="long requests that hold the server full during --probe (its --max-pending)")
    p.add_argument(
        "--api-key", default=os.environ.get("SWITCHYARD_API_KEY"),
        help="Bearer key for a server with API keys (default: $SWITCHYARD_API_KEY; prefer the variable: command lines are visible)",
    )
    return p.parse_args(argv)


def cli(argv: list[str] | None = None) -> None:
    sys.exit(trio.run(main, parse_args(argv)))


if __name__ == "__main__":
    cli()
