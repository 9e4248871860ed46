"""Do n and best_of share one prefill? Shown with the engine's own counters, on the default model.

    python -m ops.bench.shared_prefill [--prompt-tokens 128] [--max-tokens 16] [--model DIR]

Starts the whole stack in-process (Runtime + HTTP edge on a loopback port,
ops.harness.servers.in_process_server),
then sends one /v1/completions request per case — n=1, n=4, best_of=4 (n=1) — each with its own
128-token prompt (a different header, so no case is served from another's prefix cache). For
each it prints one JSON row:

    {"case", "prompt_tokens", "n", "best_of", "sequences", "prefill_tokens_delta",
     "bound", "ok", "wall_s"}

`prefill_tokens_delta` is the growth of `runtime.statistics()["prefill_tokens"]` (prompt tokens
the engine computed, not served from its prefix cache) over the request. The step that finishes
the first sequence's prompt samples every sibling's first token from the same row and the
siblings share its KV blocks (the partly filled last one copied), so the delta is exactly one
prompt (`bound`) whatever n or best_of is; four prompts' worth would mean no sharing.
Exits 1 when a row is over its bound.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import httpx
import trio

from ops.harness.prompts import build_prompts, default_model_dir
from ops.harness.servers import InProcessServer, in_process_server
from runtime.config import RuntimeConfig

CASES: list[tuple[str, dict[str, Any]]] = [
    ("n=1", {"n": 1}),
    ("n=4", {"n": 4}),
    ("best_of=4", {"n": 1, "best_of": 4}),
]


async def _idle_stats(runtime: Any, timeout: float = 30.0) -> dict[str, Any]:
    with trio.fail_after(timeout):
        while True:
            stats = runtime.statistics()
            if stats["live_requests"] == 0 and stats["requests"] == 0 and stats["waiting"] == 0 and stats["running"] == 0:
                return stats
            await trio.sleep(0.01)


async def _case(http: httpx.AsyncClient, server: InProcessServer, base: dict[str, Any], case: str, fields: dict[str, Any], prompt: str) -> dict[str, Any]:
    """One request of `case` on an idle engine, and how many prompt tokens the engine computed for it."""
    before = (await _idle_stats(server.runtime))["prefill_tokens"]
    started = time.perf_counter()
    r = await http.post("/v1/completions", json={**base, **fields, "prompt": prompt})
    wall = time.perf_counter() - started
    r.raise_for_status()
    body = r.json()
    delta = (await _idle_stats(server.runtime))["prefill_tokens"] - before
    prompt_tokens = body["usage"]["prompt_tokens"]
    bound = prompt_tokens
    return {
        "case": case,
        "prompt_tokens": prompt_tokens,
        "n": fields["n"],
        "best_of": fields.get("best_of"),
        "sequences": fields.get("best_of", fields["n"]),
        "prefill_tokens_delta": delta,
        "bound": bound,
        "ok": delta == bound and len(body["choices"]) == fields["n"],
        "wall_s": round(wall, 3),
    }


async def measure(args: argparse.Namespace) -> int:
    """Every case, one JSON row each on stdout; 1 when a row is over its bound."""
    from runtime.logging import configure_logging

    configure_logging("warning")  # stdout holds only the JSON rows

    config = RuntimeConfig(model=args.model, port=0, served_name="bench", log_level="warning")
    model_dir = args.model or str(default_model_dir())
    prompts = build_prompts(model_dir, len(CASES) + 1, args.prompt_tokens, mode="unique")
    failures = 0
    async with trio.open_nursery() as nursery:
        server = await in_process_server(nursery, config)
        try:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=600) as http:
                base = {"model": "bench", "max_tokens": args.max_tokens, "temperature": 1.0, "seed": 1, "ignore_eos": True}
                # Warm-up on a prompt of its own (first-request costs stay out of the rows).
                r = await http.post("/v1/completions", json={**base, "prompt": prompts[-1], "max_tokens": 2})
                r.raise_for_status()
                for (case, fields), prompt in zip(CASES, prompts):
                    row = await _case(http, server, base, case, fields, prompt)
                    failures += not row["ok"]
                    print(json.dumps(row), flush=True)
        finally:
            server.stop.set()
    return 1 if failures else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--model", default=None, help="a local HF model directory (default: the embedded default model)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return trio.run(measure, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
