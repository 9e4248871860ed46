"""The closed-loop streaming load client for an OpenAI-compatible /v1/completions endpoint.

At each concurrency level c, c workers each keep one request in flight: when a request ends,
its worker sends the next one, until the level's request budget (default max(2c, 8)) is issued
or its time cap passes; requests already in flight then finish (each bounded by its own
timeout). Every request is a streaming completion of a 128-token synthetic prompt asking for
64 tokens at temperature 0, with whatever extra body fields force exactly 64 tokens on the
target (Switchyard: `ignore_eos: true`; transformers serve: a generation_config with no EOS).

Per request: TTFT (send -> first chunk with non-empty text), the chunk arrival times, the
completion tokens the final usage chunk reports (else the number of content chunks), the
prompt tokens it reports. Per level: output tokens/s = total completion tokens / level wall
time (first send -> last response end), TTFT p50/p99, ITL p50/p99 two ways (below), errors.

ITL, two ways:
- `itl_req`: per request (t_last_chunk - t_first_chunk) / (completion_tokens - 1), the mean
  time per token after the first; correct even when one SSE chunk carries several tokens.
- `itl_chunk`: the raw gaps between successive content chunks, pooled over the level's
  requests; equals the per-token gap only when every chunk carries one token (a server that
  coalesces shows near-zero gaps plus long ones).

`closed_loop` is the loop itself, for drivers whose requests are not streamed completions;
`one_stream` times any streamed body (a chat with images, say).
Run against a server already up: python -m ops.bench.load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import httpx

from ops.harness.servers import DEFAULT_SERVED_NAME
from ops.harness.stats import error_kinds, ms, percentile

DEFAULT_LEVELS = (1, 4, 16, 32, 64)
OUTPUT_TOKENS = 64
R = TypeVar("R")


@dataclass
class Target:
    """Where to send requests and the body fields that make the server produce exactly 64 tokens."""

    name: str
    base_url: str
    model: str | None
    path: str = "/v1/completions"
    extra_body: dict[str, Any] = field(default_factory=dict)


def switchyard_target(base_url: str, model: str = DEFAULT_SERVED_NAME) -> Target:
    return Target("switchyard", base_url, model, extra_body={"ignore_eos": True})


@dataclass
class RequestResult:
    ok: bool
    error: str | None = None
    status: int | None = None
    start: float = 0.0  # perf_counter at send
    end: float = 0.0  # perf_counter when the stream ended
    ttft: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # perf_counter of each non-empty text chunk
    completion_tokens: int = 0  # from usage, else the number of content chunks
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None


def build_body(target: Target, prompt: str, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if target.model is not None:
        body["model"] = target.model
    body.update(target.extra_body)
    return body


def _record_chunk(chunk: dict[str, Any], now: float, res: RequestResult) -> int:
    """One parsed SSE chunk into `res`; 1 when it carried text, else 0."""
    content = 0
    choices = chunk.get("choices") or []
    if choices:
        choice = choices[0]
        text = choice.get("text")
        if text is None:  # a chat endpoint's delta, should a target use one
            text = (choice.get("delta") or {}).get("content")
        if text:
            content = 1
            res.chunk_times.append(now)
            if res.ttft is None:
                res.ttft = now - res.start
        if choice.get("finish_reason"):
            res.finish_reason = choice["finish_reason"]
    usage = chunk.get("usage")
    if usage:
        res.usage_completion_tokens = usage.get("completion_tokens")
        res.usage_prompt_tokens = usage.get("prompt_tokens")
    return content


async def _read_stream(resp: httpx.Response, res: RequestResult) -> tuple[int, bool] | None:
    """The SSE stream into `res`: (content chunks, whether [DONE] came), or None after an error
    it recorded in `res`."""
    n_content = 0
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return n_content, True
        now = time.perf_counter()
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            res.error = f"bad SSE data: {data[:200]}"
            return None
        if "error" in chunk:
            res.error = f"stream error: {json.dumps(chunk['error'])[:300]}"
            return None
        n_content += _record_chunk(chunk, now, res)
    return n_content, False


async def one_request(client: httpx.AsyncClient, target: Target, prompt: str, max_tokens: int, timeout: float) -> RequestResult:
    """Send one streaming completion and time its chunks; never raises (errors go in the result)."""
    return await one_stream(client, target.base_url.rstrip("/") + target.path, build_body(target, prompt, max_tokens), timeout)


async def one_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any], timeout: float) -> RequestResult:
    """POST one streaming body (a completion's or a chat's) and time its chunks; never raises."""
    res = RequestResult(ok=False)
    res.start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("POST", url, json=body) as resp:
                res.status = resp.status_code
                if resp.status_code != 200:
                    text = (await resp.aread()).decode("utf-8", "replace")
                    res.error = f"HTTP {resp.status_code}: {text[:300]}"
                    return res
                read = await _read_stream(resp, res)
                if read is None:
                    return res
                n_content, saw_done = read
    except TimeoutError:
        res.error = f"timeout after {timeout:.0f}s"
        res.end = time.perf_counter()
        return res
    except httpx.HTTPError as e:
        res.error = f"{type(e).__name__}: {e}"
        res.end = time.perf_counter()
        return res
    res.end = time.perf_counter()
    res.completion_tokens = res.usage_completion_tokens if res.usage_completion_tokens is not None else n_content
    if res.ttft is None:
        res.error = "no content chunk"
    elif not saw_done and res.usage_completion_tokens is None:
        res.error = "stream ended without [DONE] or usage"
    else:
        res.ok = True
    return res


def summarize(results: list[RequestResult], wall: float, expected_prompt_tokens: int | None, max_tokens: int) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    itl_req = [(r.chunk_times[-1] - r.chunk_times[0]) / (r.completion_tokens - 1) for r in ok if r.completion_tokens > 1 and len(r.chunk_times) >= 2]
    itl_chunk = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    latencies = [r.end - r.start for r in ok]
    total_tokens = sum(r.completion_tokens for r in ok)
    chunks_per_req = [len(r.chunk_times) for r in ok]
    mismatches = None
    if expected_prompt_tokens is not None:
        mismatches = sum(1 for r in ok if r.usage_prompt_tokens is not None and r.usage_prompt_tokens != expected_prompt_tokens)
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "error_kinds": error_kinds(results),
        "wall_s": round(wall, 3),
        "completion_tokens": total_tokens,
        "output_tok_s": round(total_tokens / wall, 2) if wall > 0 else None,
        "req_s": round(len(ok) / wall, 3) if wall > 0 else None,
        "ttft_ms": {"p50": ms(percentile(ttfts, 50)), "p99": ms(percentile(ttfts, 99)), "mean": ms(sum(ttfts) / len(ttfts)) if ttfts else None, "max": ms(max(ttfts)) if ttfts else None},
        "itl_req_ms": {"p50": ms(percentile(itl_req, 50)), "p99": ms(percentile(itl_req, 99))},
        "itl_chunk_ms": {"p50": ms(percentile(itl_chunk, 50)), "p99": ms(percentile(itl_chunk, 99)), "n": len(itl_chunk)},
        "latency_ms": {"p50": ms(percentile(latencies, 50)), "p99": ms(percentile(latencies, 99))},
        "chunks_per_request": {"min": min(chunks_per_req) if chunks_per_req else None, "max": max(chunks_per_req) if chunks_per_req else None},
        "requests_short_of_max_tokens": sum(1 for r in ok if r.completion_tokens < max_tokens),
        "prompt_token_mismatches": mismatches,
        "usage_reported": sum(1 for r in ok if r.usage_completion_tokens is not None),
    }


async def closed_loop(concurrency: int, count: int, send: Callable[[int], Awaitable[R]], deadline: float = math.inf) -> tuple[list[R], int]:
    """`concurrency` workers, each keeping one request in flight: request i is `send(i)`, until
    `count` are issued or time.perf_counter() passes `deadline`. The results in the order they
    finished, and how many were issued."""
    results: list[R] = []
    issued = 0

    async def worker() -> None:
        nonlocal issued
        while issued < count and time.perf_counter() < deadline:
            i = issued
            issued += 1
            results.append(await send(i))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results, issued


async def run_level(
    client: httpx.AsyncClient,
    target: Target,
    prompts: list[str],
    concurrency: int,
    n_requests: int,
    time_cap: float,
    max_tokens: int,
    request_timeout: float,
    expected_prompt_tokens: int | None,
    prompt_offset: int = 0,
) -> dict[str, Any]:
    """Keep `concurrency` requests in flight until `n_requests` are issued or `time_cap` passes."""
    t0 = time.perf_counter()

    def send(i: int) -> Awaitable[RequestResult]:
        return one_request(client, target, prompts[(prompt_offset + i) % len(prompts)], max_tokens, request_timeout)

    # Every request is bounded by request_timeout, and no request starts after the deadline,
    # so the level ends by time_cap + request_timeout; the outer bound is belt and braces.
    async with asyncio.timeout(time_cap + request_timeout + 30):
        results, issued = await closed_loop(concurrency, n_requests, send, deadline=t0 + time_cap)
    wall = (max((r.end for r in results), default=t0)) - t0
    summary = summarize(results, wall, expected_prompt_tokens, max_tokens)
    summary["concurrency"] = concurrency
    summary["requests_planned"] = n_requests
    summary["hit_time_cap"] = issued < n_requests
    summary["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    return summary


def requests_for_level(c: int, min_requests: int = 8, per_slot: int = 2) -> int:
    return max(per_slot * c, min_requests)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def sweep(
    target: Target,
    prompts: list[str],
    levels: list[int],
    max_tokens: int = OUTPUT_TOKENS,
    time_cap: float = 180.0,
    request_timeout: float = 300.0,
    requests_per_slot: int = 2,
    min_requests: int = 8,
    warmup_requests: int = 2,
    expected_prompt_tokens: int | None = 128,
    log: Callable[[str], None] = _log,
) -> dict[str, Any]:
    """Run every level in order against `target`; returns {"target", "config", "levels": [...]}."""
    limits = httpx.Limits(max_connections=max(levels) + 8, max_keepalive_connections=max(levels) + 8)
    timeout = httpx.Timeout(request_timeout, connect=30.0)
    config = {
        "levels": levels,
        "max_tokens": max_tokens,
        "time_cap_s": time_cap,
        "request_timeout_s": request_timeout,
        "requests_per_level": {str(c): requests_for_level(c, min_requests, requests_per_slot) for c in levels},
        "warmup_requests": warmup_requests,
        "prompt_tokens": expected_prompt_tokens,
        "distinct_prompts": len(set(prompts)),
    }
    out: dict[str, Any] = {"target": asdict(target), "config": config, "levels": []}
    offset = 0
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        if warmup_requests > 0:
            log(f"[{target.name}] warmup: {warmup_requests} request(s)")
            # The warmup prompts come from the end of the list so they do not seed a prefix
            # cache with the prompts of the measured requests (in unique mode).
            warm = await asyncio.gather(*(one_request(client, target, prompts[-1 - i], max_tokens, request_timeout) for i in range(warmup_requests)))
            out["warmup"] = [{"ok": r.ok, "error": r.error, "ttft_ms": ms(r.ttft, 1), "completion_tokens": r.completion_tokens} for r in warm]
        for c in levels:
            n = requests_for_level(c, min_requests, requests_per_slot)
            log(f"[{target.name}] c={c}: {n} requests")
            summary = await run_level(client, target, prompts, c, n, time_cap, max_tokens, request_timeout, expected_prompt_tokens, offset)
            offset += n
            log(
                f"[{target.name}] c={c}: {summary['output_tok_s']} tok/s, TTFT p50 {summary['ttft_ms']['p50']} ms, "
                f"ITL p50 {summary['itl_req_ms']['p50']} ms, errors {summary['errors']}"
            )
            out["levels"].append(summary)
    return out


def parse_levels(text: str) -> list[int]:
    levels = [int(x) for x in text.split(",") if x.strip()]
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError(f"bad levels {text!r}")
    return levels


def prompts_needed(levels: list[int], requests_per_slot: int, min_requests: int, warmup: int) -> int:
    return sum(requests_for_level(c, min_requests, requests_per_slot) for c in levels) + warmup
