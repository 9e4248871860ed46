"""What do LoRA adapters cost? One server with N adapters on the embedded model: c requests all
for the base, against the same spread over the adapters, in alternating rounds.

    python -m ops.bench.lora [--adapters 8] [--max-loras N] [--rank 16] [--concurrency 32]
        [--rounds 3] [--requests-per-slot 2] [--server-args '--spec-decoding off'] [--out F]

The adapters are made with PEFT on the embedded SmolLM2-135M's dense conversion (every
projection, random A and B at a fine-tune's scale), all named at start (`--enable-lora
--lora-modules`: read then, the server's log says how long, `lora_adapters_loaded`); each takes
one of `--max-loras` slots (default: one each) on its first request. First, each adapter's
first request and a second one, one at a time: what filling its slot cost (the log's
`lora_slot_filled`) and the two requests' time to first token. Then each round runs both arms
on prompts neither has seen (no prefix-cache hit), in alternating order; the figure is the
median of the rounds' tok/s ratios (adapters / base), the issue's target 0.8. Both arms run in
the server with adapters, so `--versus-default` adds the default server's base tok/s for what
enabling LoRA costs the base itself. Fewer slots than adapters (`--max-loras 4`) measure
requests waiting for a slot and slots refilled.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from ops.harness.adapters import make_adapter
from ops.harness.load import OUTPUT_TOKENS, RequestResult, Target, closed_loop, one_request, summarize, switchyard_target
from ops.harness.prompts import PROMPT_TOKENS, build_prompts, default_model_dir
from ops.harness.results import cpu_model, log, start_run, write_results
from ops.harness.servers import DEFAULT_SERVED_NAME, switchyard_server

WARMUP_REQUESTS = 4


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--max-loras", type=int, default=None, help="the server's slots (default: --adapters)")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests-per-slot", type=int, default=2)
    p.add_argument("--server-args", default="--spec-decoding off", help="extra `switchyard serve` arguments for the server with adapters")
    p.add_argument("--versus-default", action="store_true", help="also the default server (no adapters) on the base, each round")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def make_adapters(base: Path, root: Path, count: int, rank: int) -> dict[str, Path]:
    """`count` adapters on every projection of `base`, at a fine-tune's scale."""
    fields = dict(r=rank, lora_alpha=2 * rank, target_modules="all-linear")
    return {f"lora-{i}": make_adapter(base, root / f"lora-{i}", i, 0.02, **fields) for i in range(count)}


def level(targets: list[Target], prompts: list[str], concurrency: int, timeout: float) -> dict[str, Any]:
    """One closed-loop level; request i goes to targets[i % len(targets)]."""

    async def run() -> tuple[list[RequestResult], float]:
        async with httpx.AsyncClient(timeout=timeout) as client:
            t0 = time.perf_counter()
            results, _ = await closed_loop(concurrency, len(prompts), lambda i: one_request(client, targets[i % len(targets)], prompts[i], OUTPUT_TOKENS, timeout))
            return results, max((r.end for r in results), default=t0) - t0

    results, wall = asyncio.run(run())
    got = summarize(results, wall, PROMPT_TOKENS, OUTPUT_TOKENS)
    return {"tok_s": got["output_tok_s"], "ttft_p50_ms": got["ttft_ms"]["p50"], "itl_p50_ms": got["itl_req_ms"]["p50"], "errors": got["errors"]}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"{result['adapters']} adapters (rank {result['rank']}) at c={result['concurrency']}, {result['rounds']} alternated rounds, CPU {result['cpu']}",
        "",
        "| round | base tok/s | adapters tok/s | adapters / base | default server tok/s |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in result["measurements"]:
        default = row.get("default", {}).get("tok_s", "-")
        lines.append(f"| {row['round']} | {row['base']['tok_s']} | {row['adapters']['tok_s']} | {row['ratio']} | {default} |")
    first = result["first_use"]
    lines += [
        "", f"Median adapters / base: **{result['median_ratio']}** (target 0.8); adapters read at start in {result['load_s']} s; {result['fills']} slot fills in all",
        f"An adapter's first request: its slot filled in {first['fill_ms_p50']} ms (median), time to first token {first['ttft_first_ms_p50']} ms against {first['ttft_again_ms_p50']} ms for its second",
    ]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model = default_model_dir()
    out_path, log_dir = start_run(args.out, "lora-")
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    size = args.concurrency * args.requests_per_slot
    arms = ["base", "adapters", *(["default"] if args.versus_default else [])]
    prompts = build_prompts(str(model), len(arms) * (args.rounds * size + WARMUP_REQUESTS) + 2 * args.adapters, PROMPT_TOKENS, "unique")
    result: dict[str, Any] = {
        "adapters": args.adapters, "rank": args.rank, "concurrency": args.concurrency, "rounds": args.rounds, "requests": size,
        "server_args": args.server_args, "cpu": cpu_model(), "measurements": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        adapters = make_adapters(model, Path(tmp), args.adapters, args.rank)
        modules = [f"{name}={path}" for name, path in adapters.items()]
        flags = [
            "--no-embeddings",
            "--enable-lora",
            "--max-loras",
            str(args.max_loras or args.adapters),
            "--max-lora-rank",
            str(args.rank),
            "--lora-modules",
            *modules,
        ]
        log_path = log_dir / "switchyard-lora.log"
        srv = stack.enter_context(switchyard_server(log_path, [*flags, *shlex.split(args.server_args)], args.startup_timeout))
        base = switchyard_target(srv.base_url, DEFAULT_SERVED_NAME)
        targets = {"base": [base], "adapters": [switchyard_target(srv.base_url, name) for name in adapters]}
        if args.versus_default:
            default = stack.enter_context(switchyard_server(log_dir / "switchyard-default.log", ["--no-embeddings"], args.startup_timeout))
            targets["default"] = [switchyard_target(default.base_url, DEFAULT_SERVED_NAME)]
        result["load_s"] = _load_seconds(log_path)
        cursor = 0
        for arm in arms:  # unmeasured: first requests pay one-time costs (the adapters' first ones measured, after the base's)
            if arm == "adapters":
                result["first_use"] = first_use(targets[arm], prompts[cursor : cursor + 2 * args.adapters], log_path, args.request_timeout)
                cursor += 2 * args.adapters
            level(targets[arm], prompts[cursor : cursor + WARMUP_REQUESTS], WARMUP_REQUESTS, args.request_timeout)
            cursor += WARMUP_REQUESTS
        for r in range(args.rounds):
            row: dict[str, Any] = {"round": r, "order": arms if r % 2 == 0 else list(reversed(arms))}
            for arm in row["order"]:
                row[arm] = level(targets[arm], prompts[cursor : cursor + size], args.concurrency, args.request_timeout)
                cursor += size
            row["ratio"] = round(row["adapters"]["tok_s"] / row["base"]["tok_s"], 3) if row["base"]["tok_s"] else None
            log(f"[round {r}] base {row['base']['tok_s']} tok/s, adapters {row['adapters']['tok_s']} tok/s: {row['ratio']}")
            result["measurements"].append(row)
        result["fills"] = len(_slot_fills(log_path))
    ratios = [m["ratio"] for m in result["measurements"] if m["ratio"] is not None]
    result["median_ratio"] = round(statistics.median(ratios), 3) if ratios else None
    write_results(result, out_path, started, markdown)


def first_use(targets: list[Target], prompts: list[str], log_path: Path, timeout: float) -> dict[str, Any]:
    """Each adapter's first request (its slot filled) then a second, one at a time: the fills'
    median ms from the server's log and the two requests' median time to first token."""
    first = [level([t], [p], 1, timeout)["ttft_p50_ms"] for t, p in zip(targets, prompts[::2], strict=False)]
    again = [level([t], [p], 1, timeout)["ttft_p50_ms"] for t, p in zip(targets, prompts[1::2], strict=False)]
    fills = _slot_fills(log_path)
    return {
        "fill_ms_p50": statistics.median(fills) if fills else None, "ttft_first_ms_p50": statistics.median(first),
        "ttft_again_ms_p50": statistics.median(again),
    }  # fmt: skip


def _events(log_path: Path, event: str) -> list[dict[str, Any]]:
    import json

    found = []
    for line in log_path.read_text().splitlines():
        if event in line:
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def _load_seconds(log_path: Path) -> float | None:
    loaded = _events(log_path, "lora_adapters_loaded")
    return float(loaded[0]["seconds"]) if loaded and "seconds" in loaded[0] else None


def _slot_fills(log_path: Path) -> list[float]:
    return [float(e["ms"]) for e in _events(log_path, "lora_slot_filled") if "ms" in e]


if __name__ == "__main__":
    main()
