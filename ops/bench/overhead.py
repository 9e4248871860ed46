"""What does the server itself cost at one concurrency? The bare native step and the server, in alternating rounds.

    python -m ops.bench.overhead --concurrency 32 --rounds 5 [--requests-per-slot 2]
        [--server-args '--dtype bfloat16'] [--bare-variant native]
        [--compare-args '--dtype bfloat16 --async-scheduling']
        [--model DIR]   # the servers serve DIR too, under its directory's name

Why alternate: this shared 2-core VM reads the same command far apart a few minutes apart,
so ops.bench.run, which runs the bare step once and each server once, minutes apart, reads
the same server's c=32 ratio far apart from run to run (docs/performance.md, "The server's
own cost: alternated rounds"; ops/results/overhead-c32-*). Here every round runs the bare step
(ops.bench.bare_native, B = c, in a subprocess) and then the server's level back to back, and
the figure is the median of the rounds' ratios. One server process serves every round: idle,
it uses no CPU, and every request's prompt is new (two unmeasured ones go first), so its
prefix cache serves none of them.

Per round:
- bare: decode-only tok/s, and tok/s over the server's workload (B prompts' prefill plus the
  decode steps, `ops.harness.baselines.workload_tok_s`); the ratio uses the workload figure;
- server: tok/s and the p99/p50 gap between a stream's chunks (the stall target), through
  ops.harness.load at concurrency c with `requests_per_slot * c` requests;
- the load client's CPU seconds per second of the level: it shares the two cores with the
  server, and the bare step pays nothing like it;
- with `--compare-args`, a second server (those arguments) runs the same round's level too,
  the two in alternating order from round to round, and the round reports its tok/s over the
  first's: an A/B of two server settings in one alternated run;
- the server's steps, from its debug step log: how many, the mean decode rows of a step, and the
  share of the level a step was in flight (handed to the device thread and not yet answered). These say where a ratio below 1 goes: a closed loop
  ramps up (prompts come in a few per step, so that streams do not stall) and drains (streams
  finish one by one), and those steps decode fewer rows than the bare batch of c.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ops.harness.baselines import run_bare_native, workload_tok_s
from ops.harness.load import OUTPUT_TOKENS, sweep, switchyard_target
from ops.harness.prompts import PROMPT_TOKENS, build_prompts, default_model_dir
from ops.harness.results import cpu_model, log, start_run, write_results
from ops.harness.servers import RunningServer, model_server_args, step_lines, switchyard_server

WARMUP_REQUESTS = 2


def step_summary(steps: list[dict[str, Any]], level_wall_s: float) -> dict[str, Any]:
    decoding = [s["decode_rows"] for s in steps if s["decode_rows"]]
    return {
        "steps": len(steps),
        "prompt_tokens": sum(s["prompt_tokens"] for s in steps),
        "decode_rows": sum(decoding),
        "mean_decode_rows": round(statistics.fmean(decoding), 1) if decoding else None,
        # From handing a plan over to its result: the device's step plus the hand-over.
        "in_flight_share": round(sum(s["ms"] for s in steps) / 1000 / level_wall_s, 3) if level_wall_s else None,
    }


def one_round(args: argparse.Namespace, servers: list[tuple[RunningServer, int]], prompts: list[list[str]], round_no: int, out_dir: Path) -> dict[str, Any]:
    """The bare step, then each server's level (their order alternating by round); each
    server's (process, log offset) is updated in place."""
    c = args.concurrency
    bare = run_bare_native(str(args.model), args.bare_variant, [c], args.bare_dtype, OUTPUT_TOKENS, args.threads, out_dir, 900)
    entry = bare["variants"][args.bare_variant]["batches"][str(c)]
    bare_workload = workload_tok_s(entry, c, OUTPUT_TOKENS)
    rows: dict[int, dict[str, Any]] = {}
    order = list(range(len(servers))) if round_no % 2 == 0 else list(reversed(range(len(servers))))
    for i in order:
        srv, offset = servers[i]
        rows[i], offset = _server_row(srv, args.served_name, prompts[i], c, entry, bare_workload, offset)
        servers[i] = (srv, offset)
    row = {"round": round_no, "bare_decode_tok_s": entry["decode_tok_s"], "bare_workload_tok_s": bare_workload, "order": order, **rows[0]}
    if len(servers) > 1:
        row["compare"] = rows[1]
        row["compare_over_server"] = round(rows[1]["server_tok_s"] / rows[0]["server_tok_s"], 3) if rows[0]["server_tok_s"] else None
    log(f"[round {round_no}] bare {bare_workload} tok/s (workload), server {row['server_tok_s']} tok/s: {row['ratio_workload']}, stall {row['stall_ratio']}, compare/server {row.get('compare_over_server')}")
    return row


def _server_row(srv: RunningServer, served_name: str, prompts: list[str], c: int, entry: dict[str, Any], bare_workload: float | None, log_offset: int) -> tuple[dict[str, Any], int]:
    level, client_cpu = _level(srv, served_name, prompts, c)
    steps, log_offset = step_lines(srv.log_path, log_offset)
    gaps, tok_s = level["itl_chunk_ms"], level["output_tok_s"]
    row = {
        "server_tok_s": tok_s,
        "ratio_workload": round(tok_s / bare_workload, 3) if bare_workload and tok_s else None,
        "ratio_decode_only": round(tok_s / entry["decode_tok_s"], 3) if entry.get("decode_tok_s") and tok_s else None,
        "chunk_gap_p50_ms": gaps["p50"],
        "chunk_gap_p99_ms": gaps["p99"],
        "stall_ratio": round(gaps["p99"] / gaps["p50"], 2) if gaps["p50"] and gaps["p99"] else None,
        "ttft_p50_ms": level["ttft_ms"]["p50"],
        "itl_req_p50_ms": level["itl_req_ms"]["p50"],
        "errors": level["errors"],
        "client_cpu_per_s": round(client_cpu / level["wall_s"], 3) if level["wall_s"] else None,
        "server_steps": step_summary(steps, level["wall_s"]),
    }
    return row, log_offset


def _level(srv: RunningServer, served_name: str, prompts: list[str], concurrency: int) -> tuple[dict[str, Any], float]:
    """One closed-loop level sending each of `prompts` once, at `concurrency`, and the load
    client's CPU seconds for it (it shares the cores with the server)."""
    cpu0 = time.process_time()
    swept = asyncio.run(
        sweep(
            switchyard_target(srv.base_url, served_name), prompts, [concurrency], requests_per_slot=len(prompts) // concurrency,
            min_requests=len(prompts), warmup_requests=0, expected_prompt_tokens=PROMPT_TOKENS,
        )
    )  # fmt: skip
    return swept["levels"][0], time.process_time() - cpu0


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def median(key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return round(statistics.median(values), 3) if values else None

    keys = ("ratio_workload", "ratio_decode_only", "server_tok_s", "bare_workload_tok_s", "stall_ratio", "client_cpu_per_s", "itl_req_p50_ms", "compare_over_server")
    out: dict[str, Any] = {key: median(key) for key in keys}
    compared = [r["compare"] for r in rows if "compare" in r]
    if compared:
        out["compare"] = summarize(compared)
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"c={result['concurrency']}, {result['requests_per_slot']} requests per slot, server args `{result['server_args']}`, bare `{result['bare_variant']}`, CPU {result['cpu']}",
        "",
        "| round | bare workload tok/s | server tok/s | server / bare | stall p99/p50 | client CPU | steps | mean decode rows | steps in flight |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rounds"]:
        s = r["server_steps"]
        lines.append(
            f"| {r['round']} | {r['bare_workload_tok_s']} | {r['server_tok_s']} | {r['ratio_workload']} | {r['stall_ratio']} | {r['client_cpu_per_s']} | {s['steps']} | {s['mean_decode_rows']} | {s['in_flight_share']} |"
        )
    m = result["median"]
    lines.append(
        f"| **median** | {m['bare_workload_tok_s']} | {m['server_tok_s']} | **{m['ratio_workload']}** | {m['stall_ratio']} | {m['client_cpu_per_s']} | | | |"
    )
    if "compare" in m:
        lines += ["", f"Compared with `{result['compare_args']}` in the same rounds:", "", "| round | server tok/s | compare tok/s | compare / server | ITL p50 ms server, compare |", "|---:|---:|---:|---:|---:|"]
        for r in result["rounds"]:
            lines.append(f"| {r['round']} | {r['server_tok_s']} | {r['compare']['server_tok_s']} | {r['compare_over_server']} | {r['itl_req_p50_ms']}, {r['compare']['itl_req_p50_ms']} |")
        lines.append(f"| **median** | {m['server_tok_s']} | {m['compare']['server_tok_s']} | **{m['compare_over_server']}** | {m['itl_req_p50_ms']}, {m['compare']['itl_req_p50_ms']} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests-per-slot", type=int, default=2, help="requests per round = this * concurrency (ops.bench.run's default is 2)")
    p.add_argument("--server-args", default="--dtype bfloat16", help="`switchyard serve` arguments, one shell-quoted string")
    p.add_argument("--prompt-mode", default="unique", choices=["unique", "grounded"], help="unique texts, or grounded: each answer copies its prompt (speculative decoding's case)")
    p.add_argument("--compare-args", default=None, help="a second server's `switchyard serve` arguments: each round runs its level too (A/B)")
    p.add_argument("--bare-variant", default="native", help="the ops.bench.bare_native variant that runs the server's kernels, e.g. native+int8")
    p.add_argument("--bare-dtype", default="bfloat16", help="the bare step's dtype: the server's (--server-args' --dtype)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the bare step's torch threads (default: every core, as the server uses)")
    p.add_argument("--model", default=None, help="local HF model directory (default: the embedded SmolLM2)")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # A --model of its own is served too, under its directory's name (as ops.bench.run does);
    # without one, the servers serve their default, the embedded model the bare step reads.
    model_args, args.served_name = model_server_args(args.model)
    args.model = args.model or str(default_model_dir())
    out_path, log_dir = start_run(args.out, "overhead-")
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    per_round = args.concurrency * args.requests_per_slot
    arg_sets = [args.server_args] + ([args.compare_args] if args.compare_args else [])
    prompts = build_prompts(args.model, len(arg_sets) * (args.rounds * per_round + WARMUP_REQUESTS), PROMPT_TOKENS, args.prompt_mode)
    result: dict[str, Any] = {
        "concurrency": args.concurrency, "requests_per_slot": args.requests_per_slot, "server_args": args.server_args,
        "compare_args": args.compare_args, "prompt_mode": args.prompt_mode, "bare_variant": args.bare_variant, "threads": args.threads, "cpu": cpu_model(), "rounds": [],
    }  # fmt: skip
    with ExitStack() as stack:
        servers, own_prompts = [], []
        for i, server_args in enumerate(arg_sets):
            srv = stack.enter_context(switchyard_server(log_dir / f"switchyard-{i}.log", [*model_args, "--no-embeddings", "--log-level", "debug", *shlex.split(server_args)], args.startup_timeout))
            mine = prompts[i :: len(arg_sets)]  # every server gets new prompts: no prefix cache hit
            # Unmeasured requests first (the first prompt of a new length pays oneDNN's kernel
            # compilation); their steps are read past, so no round counts them.
            _level(srv, args.served_name, mine[-WARMUP_REQUESTS:], WARMUP_REQUESTS)
            servers.append((srv, step_lines(srv.log_path, 0)[1]))
            own_prompts.append(mine)
        for r in range(args.rounds):
            round_prompts = [mine[r * per_round : (r + 1) * per_round] for mine in own_prompts]
            result["rounds"].append(one_round(args, servers, round_prompts, r, log_dir))
    result["median"] = summarize(result["rounds"])
    write_results(result, out_path, started, markdown)


if __name__ == "__main__":
    main()
