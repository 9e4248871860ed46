"""The guided benchmark's measurement: blocks of one variant closed-loop, rounds that rotate
the variants' order, the warmup, and the length calibration of `unconstrained_long`."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Awaitable
from typing import Any

import httpx

from ops.bench.guided.report import add_ratios, summarize
from ops.bench.guided.workload import VARIANTS, Result, Workload, function_tool, one_request
from ops.harness.load import closed_loop
from ops.harness.results import log


async def run_block(client: httpx.AsyncClient, base_url: str, wl: Workload, variant: str, contents: list[str], concurrency: int) -> tuple[float, list[Result]]:
    """All of `contents` closed-loop at `concurrency`; returns (wall seconds, results)."""
    t0 = time.perf_counter()

    def send(i: int) -> Awaitable[Result]:
        return one_request(client, base_url, wl, variant, contents[i])

    # Each request is bounded by its timeout; the block's own bound is belt and braces.
    async with asyncio.timeout(wl.timeout * (1 + len(contents) // max(1, concurrency)) + 30):
        results, _ = await closed_loop(concurrency, len(contents), send)
    return max((r.end for r in results), default=t0) - t0, results


def round_order(r: int) -> list[str]:
    k = r % len(VARIANTS)
    return list(VARIANTS[k:] + VARIANTS[:k])


def _prompt_len(tok: Any, messages: list[dict[str, str]]) -> int:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tok(text, add_special_tokens=False)["input_ids"])


def _system_text(tok: Any, wl: Workload, user: dict[str, str], target: int) -> str:
    """A text describing the function tool (no constraint), cut so that a prompt of it and
    `user` has `target` tokens by the model's own tokenizer and chat template (or the nearest)."""
    spec = json.dumps(function_tool(wl.max_tokens)["function"])
    filler = ("# Tools\n\nYou can call this tool, but need not:\n\n" + spec + "\n\n") * 8
    ids = tok(filler, add_special_tokens=False)["input_ids"]
    overhead = _prompt_len(tok, [{"role": "system", "content": ""}, user])
    best: tuple[int, str] | None = None
    for n in range(max(0, target - overhead - 8), min(len(ids), target - overhead + 9)):
        text = tok.decode(ids[:n])
        miss = abs(_prompt_len(tok, [{"role": "system", "content": text}, user]) - target)
        if best is None or miss < best[0]:
            best = (miss, text)
        if miss == 0:
            break
    if best is None:
        raise RuntimeError(f"cannot build a system text for a {target}-token prompt")
    return best[1]


async def calibrate_long_prompt(client: httpx.AsyncClient, base_url: str, wl: Workload, content: str, tok: Any) -> dict[str, Any]:
    """Set `wl.system_text` so that unconstrained_long's prompt has as many tokens as
    function_tool's, as the server counts them (its usage.prompt_tokens)."""
    plain = await one_request(client, base_url, wl, "unconstrained", content, max_tokens=1)
    tool = await one_request(client, base_url, wl, "function_tool", content, max_tokens=1)
    if not (plain.ok and tool.ok and plain.prompt_tokens and tool.prompt_tokens):
        raise RuntimeError(f"calibration requests failed: {plain.error} / {tool.error}")
    user = {"role": "user", "content": content}
    offset = plain.prompt_tokens - _prompt_len(tok, [user])  # the server's count vs ours
    wl.system_text = _system_text(tok, wl, user, tool.prompt_tokens - offset)
    check = await one_request(client, base_url, wl, "unconstrained_long", content, max_tokens=1)
    return {
        "function_tool_prompt_tokens": tool.prompt_tokens,
        "unconstrained_prompt_tokens": plain.prompt_tokens,
        "unconstrained_long_prompt_tokens": check.prompt_tokens,
        "system_text_chars": len(wl.system_text),
    }


async def _warmup(client: httpx.AsyncClient, base_url: str, wl: Workload, warm_prompts: list[str], plain: int) -> list[dict[str, Any]]:
    """Each variant once (its grammar compiles and is cached), then `plain` plain requests."""
    warm = await asyncio.gather(
        *(one_request(client, base_url, wl, v, warm_prompts[i]) for i, v in enumerate(VARIANTS)),
        *(one_request(client, base_url, wl, "unconstrained", warm_prompts[len(VARIANTS) + i]) for i in range(plain)),
    )
    if not all(r.ok for r in warm):
        log(f"[guided] warmup errors: {[r.error for r in warm if not r.ok]}")
    return [{"ok": r.ok, "error": r.error, "completion_tokens": r.completion_tokens, "finish": r.finish} for r in warm]


async def _round(client: httpx.AsyncClient, base_url: str, wl: Workload, prompts: list[str], r: int, args: argparse.Namespace, tally: dict[str, Any]) -> None:
    """Every variant's block of round `r`, in that round's order, into `tally` (the blocks, and
    each variant's results and wall time)."""
    per, n_measured = args.requests_per_round, args.rounds * args.requests_per_round
    for variant in round_order(r):
        v_index = VARIANTS.index(variant)
        # Variant v, round r, request k gets prompt v * n_measured + r * per + k: the same
        # passage and instruction for every variant, its own header.
        contents = prompts[v_index * n_measured + r * per : v_index * n_measured + (r + 1) * per]
        wall, results = await run_block(client, base_url, wl, variant, contents, args.concurrency)
        tally["blocks"].append(block := _block(r, variant, wall, results))
        tally["by_variant"][variant] += results
        tally["walls"][variant] += wall
        log(f"[guided] round {r} {variant}: {block['output_tok_s']} tok/s ({block['ok']}/{len(results)} ok, {wall:.1f}s)")


def _tok_s(results: list[Result], wall: float) -> float | None:
    tokens = sum(x.completion_tokens for x in results if x.ok)
    return round(tokens / wall, 2) if wall > 0 else None


def _block(r: int, variant: str, wall: float, results: list[Result]) -> dict[str, Any]:
    return {
        "round": r, "variant": variant, "requests": len(results), "ok": sum(x.ok for x in results), "wall_s": round(wall, 3),
        "completion_tokens": sum(x.completion_tokens for x in results if x.ok), "output_tok_s": _tok_s(results, wall),
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }  # fmt: skip


async def run_rounds(base_url: str, prompts: list[str], args: argparse.Namespace, tok: Any) -> dict[str, Any]:
    wl = Workload(args.max_tokens, args.served_name, args.request_timeout)
    limits = httpx.Limits(max_connections=args.concurrency + 8, max_keepalive_connections=args.concurrency + 8)
    by_variant: dict[str, list[Result]] = {v: [] for v in VARIANTS}
    walls: dict[str, float] = {v: 0.0 for v in VARIANTS}
    out: dict[str, Any] = {"blocks": []}
    tally = {"blocks": out["blocks"], "by_variant": by_variant, "walls": walls}
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(args.request_timeout, connect=30.0)) as client:
        # Warmup prompts sit past the measured ones (their own headers).
        warm_prompts = prompts[len(VARIANTS) * args.rounds * args.requests_per_round :]
        out["calibration"] = await calibrate_long_prompt(client, base_url, wl, warm_prompts[-1], tok)
        log(f"[guided] prompt lengths: {out['calibration']}")
        out["warmup"] = await _warmup(client, base_url, wl, warm_prompts, args.warmup)
        t_start = time.monotonic()
        for r in range(args.rounds):
            if time.monotonic() - t_start > args.time_cap:
                out["hit_time_cap"] = True
                log(f"[guided] time cap {args.time_cap:.0f}s reached after {r} rounds")
                break
            await _round(client, base_url, wl, prompts, r, args, tally)
        out["rounds_completed"] = max((b["round"] for b in out["blocks"]), default=-1) + 1
    out["variants"] = {v: summarize(by_variant[v], walls[v], args.max_tokens) for v in VARIANTS}
    add_ratios(out)
    return out
