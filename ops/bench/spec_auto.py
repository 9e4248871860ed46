"""Does speculative decoding slow any workload? Two servers up, drafting off and on, in alternating rounds.

    python -m ops.bench.spec_auto [--levels 1,8,32,64] [--prompt-modes unique,grounded]
        [--rounds 3] [--on-args '--spec-decoding auto'] [--off-args '--spec-decoding off'] [--out F]

The rule for the default: `auto` only if no workload at c = 1, 8, 32, 64 is slower than
drafting off by more than 3%. Both servers stay up (idle, each uses no CPU); every round runs
each level on each server, the two in alternating order, each on prompts it has not seen (no
prefix cache hit on either side, nor in the shared n-gram pool from an earlier round's copy of
the same prompt); the figure per level and prompt mode is the median of the rounds' tok/s
ratios (on / off), beside each side's chunk-gap p99/p50 (the stall target: at most 2).
`unique` prompts are new texts whose answers need not repeat anything (drafts mostly wrong: the
case where drafting can only cost); `grounded` ones end by starting to copy their passage
(the case drafts are for).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import time
from contextlib import ExitStack
from typing import Any

from ops.harness.load import Target, sweep, switchyard_target
from ops.harness.prompts import PROMPT_TOKENS, build_prompts, default_model_dir
from ops.harness.results import cpu_model, log, start_run, write_results
from ops.harness.servers import DEFAULT_SERVED_NAME, switchyard_server

WARMUP_REQUESTS = 2
SIDES = ("off", "on")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--levels", default="1,8,32,64", help="concurrency levels, comma-separated")
    p.add_argument("--prompt-modes", default="unique,grounded", help="ops.harness.prompts modes, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests-per-slot", type=int, default=2, help="requests per level, round and server: this times the concurrency (at least --min-requests)")
    p.add_argument("--min-requests", type=int, default=6)
    p.add_argument("--on-args", default="--spec-decoding auto", help="the drafting server's extra `switchyard serve` arguments")
    p.add_argument("--off-args", default="--spec-decoding off", help="the other server's")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def level(target: Target, prompts: list[str], concurrency: int) -> dict[str, Any]:
    """One closed-loop level sending each of `prompts` once."""
    swept = asyncio.run(
        sweep(target, prompts, [concurrency], requests_per_slot=max(1, len(prompts) // concurrency), min_requests=len(prompts), warmup_requests=0, expected_prompt_tokens=PROMPT_TOKENS)
    )
    got = swept["levels"][0]
    gaps = got["itl_chunk_ms"]
    stall = round(gaps["p99"] / gaps["p50"], 2) if gaps["p50"] else None
    return {"tok_s": got["output_tok_s"], "itl_p50_ms": got["itl_req_ms"]["p50"], "ttft_p50_ms": got["ttft_ms"]["p50"], "stall_p99_p50": stall, "errors": got["errors"]}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Drafting on `{result['on_args']}` over off `{result['off_args']}`, {result['rounds']} alternated rounds, CPU {result['cpu']}",
        "",
        "| prompts | c | on / off tok/s (median) | rounds | stall p99/p50 off, on (median) | worst round |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for cell in result["cells"]:
        lines.append(
            f"| {cell['prompt_mode']} | {cell['concurrency']} | **{cell['median_ratio']}** | {', '.join(str(r) for r in cell['ratios'])} | "
            f"{cell['stall_off']}, {cell['stall_on']} | {min(cell['ratios']) if cell['ratios'] else None} |"
        )
    lines.append("")
    lines.append(f"Slowest median: {result['slowest_median']} (the rule: no cell below 0.97)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    levels = [int(c) for c in args.levels.split(",")]
    modes = args.prompt_modes.split(",")
    model = str(default_model_dir())
    out_path, log_dir = start_run(args.out, "spec-auto-")
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    sizes = {c: max(args.min_requests, c * args.requests_per_slot) for c in levels}
    per_round = sum(sizes.values())
    # Every (mode, side) gets prompts of its own: 2 sides x rounds x levels, plus a warm-up.
    prompts = {mode: build_prompts(model, 2 * (args.rounds * per_round + WARMUP_REQUESTS), PROMPT_TOKENS, mode) for mode in modes}
    result: dict[str, Any] = {
        "levels": levels, "prompt_modes": modes, "rounds": args.rounds, "requests": sizes, "on_args": args.on_args,
        "off_args": args.off_args, "cpu": cpu_model(), "measurements": [],
    }  # fmt: skip
    with ExitStack() as stack:
        targets: dict[str, Target] = {}
        for side, extra in (("off", args.off_args), ("on", args.on_args)):
            srv = stack.enter_context(switchyard_server(log_dir / f"switchyard-{side}.log", ["--no-embeddings", *shlex.split(extra)], args.startup_timeout))
            result[f"startup_{side}"] = {"health_s": srv.startup_s, "compile_s_after_health": srv.info.get("compile_s_after_health")}
            targets[side] = switchyard_target(srv.base_url, DEFAULT_SERVED_NAME)
        own = {(mode, side): prompts[mode][i::2] for mode in modes for i, side in enumerate(SIDES)}
        for mode in modes:
            for side in SIDES:  # unmeasured: the first prompts pay one-time costs
                level(targets[side], own[(mode, side)][-WARMUP_REQUESTS:], WARMUP_REQUESTS)
        for r in range(args.rounds):
            for mode in modes:
                cursor = r * per_round  # each mode's prompts are its own
                for c in levels:
                    order = list(SIDES) if (r + c) % 2 == 0 else list(reversed(SIDES))
                    row: dict[str, Any] = {"round": r, "prompt_mode": mode, "concurrency": c, "order": order}
                    for side in order:
                        row[side] = level(targets[side], own[(mode, side)][cursor : cursor + sizes[c]], c)
                    row["ratio"] = round(row["on"]["tok_s"] / row["off"]["tok_s"], 3) if row["off"]["tok_s"] else None
                    log(f"[round {r}] {mode} c={c}: off {row['off']['tok_s']} tok/s, on {row['on']['tok_s']} tok/s: {row['ratio']}")
                    result["measurements"].append(row)
                    cursor += sizes[c]
    cells = []
    for mode in modes:
        for c in levels:
            rows = [m for m in result["measurements"] if m["prompt_mode"] == mode and m["concurrency"] == c]
            ratios = [m["ratio"] for m in rows if m["ratio"] is not None]
            stalls = {side: [m[side]["stall_p99_p50"] for m in rows if m[side]["stall_p99_p50"] is not None] for side in SIDES}
            cells.append({
                "prompt_mode": mode, "concurrency": c, "ratios": ratios, "median_ratio": round(statistics.median(ratios), 3) if ratios else None,
                "stall_off": round(statistics.median(stalls["off"]), 2) if stalls["off"] else None,
                "stall_on": round(statistics.median(stalls["on"]), 2) if stalls["on"] else None,
            })  # fmt: skip
    result["cells"] = cells
    medians = [c["median_ratio"] for c in cells if c["median_ratio"] is not None]
    result["slowest_median"] = min(medians) if medians else None
    write_results(result, out_path, started, markdown)


if __name__ == "__main__":
    main()
