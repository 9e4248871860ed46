"""The workshop (ops/) without a server: every driver and tool parses its flags (--help exits 0
and names its entry point), and the harness's closed-loop client reads an SSE stream and times
it as ops/bench/README.md says, against a fake transport. The harness runs on asyncio (the
suite's async tests run on trio), so these tests are synchronous and call asyncio.run."""

from __future__ import annotations

import asyncio
import importlib
import runpy
import sys
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ops.harness.load import RequestResult, Target, closed_loop, one_request, run_level

# (module, the function that takes argv): every entry point in ops/bench, ops/gpu and ops/load.
ENTRY_POINTS = [
    ("ops.bench.run.cli", "main"),
    ("ops.bench.overhead", "main"),
    ("ops.bench.load", "main"),
    ("ops.bench.peers", "main"),
    ("ops.bench.bare_forward", "main"),
    ("ops.bench.bare_native", "main"),
    ("ops.bench.step_ab", "main"),
    ("ops.bench.quant_quality", "main"),
    ("ops.bench.guided.cli", "main"),
    ("ops.bench.embeddings", "main"),
    ("ops.bench.bare_embeddings", "main"),
    ("ops.bench.shared_prefill", "parse_args"),
    ("ops.bench.ray_serve", "main"),
    ("ops.bench.ray_cpu_split", "main"),
    ("ops.bench.gguf_random", "main"),
    ("ops.gpu.preflight", "main"),
    ("ops.gpu.models", "main"),
    ("ops.gpu.bandwidth", "main"),
    ("ops.gpu.report", "main"),
    ("ops.load.overload", "cli"),
    ("ops.load.soak", "main"),
]


@pytest.mark.parametrize(("module", "function"), ENTRY_POINTS)
def test_every_entry_point_parses_its_flags(module: str, function: str, capsys: pytest.CaptureFixture[str]) -> None:
    entry: Callable[[list[str]], object] = getattr(importlib.import_module(module), function)
    with pytest.raises(SystemExit) as exit_:
        entry(["--help"])
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("package", ["ops.bench.run", "ops.bench.guided"])
def test_driver_packages_run_as_modules(package: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", [package, "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module(package, run_name="__main__", alter_sys=True)
    assert exit_.value.code == 0
    assert f"python -m {package}" in capsys.readouterr().out  # the package's docstring is the help


def _sse(*events: str) -> bytes:
    return "".join(f"data: {e}\n\n" for e in events).encode()


STREAM = _sse(
    '{"choices": [{"text": "a"}]}',
    '{"choices": [{"text": ""}]}',  # no text: not a content chunk
    '{"choices": [{"text": "b", "finish_reason": "length"}]}',
    '{"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 128}}',
    "[DONE]",
)


def _transport(body: bytes, status: int = 200) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(status, content=body, headers={"content-type": "text/event-stream"}))


async def _one(body: bytes, status: int = 200, target: Target | None = None) -> RequestResult:
    async with httpx.AsyncClient(transport=_transport(body, status)) as client:
        return await one_request(client, target or Target("t", "http://fake", None), "p", 3, 10)


def test_one_request_reads_the_stream_and_the_usage() -> None:
    res = asyncio.run(_one(STREAM, target=Target("t", "http://fake", "m", extra_body={"ignore_eos": True})))
    assert res.ok and res.error is None
    assert len(res.chunk_times) == 2 and res.ttft is not None
    assert (res.completion_tokens, res.usage_prompt_tokens, res.finish_reason) == (3, 128, "length")


def test_one_request_reports_errors_instead_of_raising() -> None:
    refused = asyncio.run(_one(b"overloaded", status=429))
    failed = asyncio.run(_one(_sse('{"error": {"message": "boom"}}')))
    cut = asyncio.run(_one(_sse('{"choices": [{"text": "a"}]}')))
    assert (refused.ok, refused.status, refused.error) == (False, 429, "HTTP 429: overloaded")
    assert not failed.ok and failed.error is not None and failed.error.startswith("stream error")
    assert (cut.ok, cut.error) == (False, "stream ended without [DONE] or usage")


def test_a_level_counts_tokens_errors_and_prompt_mismatches() -> None:
    async def level_of_five() -> dict[str, Any]:
        async with httpx.AsyncClient(transport=_transport(STREAM)) as client:
            target = Target("t", "http://fake", None)
            return await run_level(client, target, ["p"], concurrency=2, n_requests=5, time_cap=30, max_tokens=4, request_timeout=10, expected_prompt_tokens=100)

    level = asyncio.run(level_of_five())
    assert (level["requests"], level["ok"], level["errors"], level["completion_tokens"]) == (5, 5, 0, 15)
    assert level["requests_short_of_max_tokens"] == 5 and level["prompt_token_mismatches"] == 5
    assert level["hit_time_cap"] is False and level["concurrency"] == 2


def test_closed_loop_issues_each_request_once_and_stops_at_the_deadline() -> None:
    seen: list[int] = []

    async def send(i: int) -> int:
        seen.append(i)
        await asyncio.sleep(0)
        return i

    results, issued = asyncio.run(closed_loop(3, 7, send))
    assert sorted(results) == list(range(7)) and issued == 7 and sorted(seen) == list(range(7))
    results, issued = asyncio.run(closed_loop(3, 7, send, deadline=0.0))  # already past
    assert (results, issued) == ([], 0)
