"""The guided benchmark's flags and its run: prompts, one server, the rounds, the table."""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import time
from typing import Any

import ops.bench.guided
from ops.bench.guided.report import markdown
from ops.bench.guided.rounds import run_rounds
from ops.bench.guided.workload import INSTRUCTION, TARGET_RATIO, VARIANTS, patch_grammar, people_schema
from ops.harness.prompts import build_prompts, default_model_dir, load_tokenizer
from ops.harness.results import log, start_run, utc_now, wait_for_quiet, write_results
from ops.harness.servers import DEFAULT_SERVED_NAME, switchyard_server


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=ops.bench.guided.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3, help="rounds; each runs every variant once (default 3)")
    p.add_argument("--requests-per-round", type=int, default=16, help="requests per variant per round (default 16)")
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens of every request (default 64)")
    p.add_argument("--prompt-tokens", type=int, default=96, help="tokens of the passage in each user message (default 96)")
    p.add_argument("--warmup", type=int, default=4, help="plain warmup requests, besides one per variant")
    p.add_argument("--time-cap", type=float, default=300.0, help="no round starts after this many seconds of measuring")
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--served-name", default=DEFAULT_SERVED_NAME)
    p.add_argument("--server-args", default="", help="extra `switchyard serve` arguments, one shell-quoted string")
    p.add_argument("--quiet-load", type=float, default=None, help="before starting, wait until the 1-min load average is at most this")
    p.add_argument("--quiet-wait", type=float, default=300.0)
    p.add_argument("--out", default=None, help="results JSON (default ops/results/guided-<UTC time>.json)")
    args = p.parse_args(argv)
    if min(args.concurrency, args.rounds, args.requests_per_round, args.max_tokens, args.prompt_tokens) < 1:
        p.error("--concurrency, --rounds, --requests-per-round, --max-tokens and --prompt-tokens must be at least 1")
    return args


def _config(args: argparse.Namespace, prompts: list[str], user_lengths: list[int]) -> dict[str, Any]:
    return {
        "concurrency": args.concurrency, "rounds": args.rounds, "requests_per_round": args.requests_per_round,
        "max_tokens": args.max_tokens, "passage_tokens": args.prompt_tokens, "user_message_tokens": user_lengths,
        "variants": list(VARIANTS), "stream": False, "temperature": 0.0, "target_ratio": TARGET_RATIO,
        "json_schema": people_schema(args.max_tokens), "lark_grammar": patch_grammar(args.max_tokens),
        "example_user_message": prompts[0],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out_path, log_dir = start_run(args.out, "guided-")
    model_dir = str(default_model_dir())
    n_prompts = len(VARIANTS) * args.rounds * args.requests_per_round + len(VARIANTS) + args.warmup + 1
    prompts = [p + INSTRUCTION for p in build_prompts(model_dir, n_prompts, args.prompt_tokens, "unique")]
    tok = load_tokenizer(model_dir)
    user_lengths = sorted({len(tok(x)["input_ids"]) for x in prompts})
    result: dict[str, Any] = {
        "started_utc": utc_now(), "argv": sys.argv[1:] if argv is None else argv, "config": _config(args, prompts, user_lengths),
        "model_dir": model_dir, "served_name": args.served_name, "cpu_count": os.cpu_count(),
    }  # fmt: skip
    if args.quiet_load is not None:
        result["quiet_wait"] = wait_for_quiet(args.quiet_load, args.quiet_wait)
    result["loadavg_start"] = os.getloadavg()
    t0 = time.monotonic()
    server: dict[str, Any] = {}
    result["server"] = server
    try:
        with switchyard_server(log_dir / "switchyard.log", shlex.split(args.server_args), args.startup_timeout) as srv:
            server.update(cmd=srv.cmd, log=str(srv.log_path), startup_s=srv.startup_s, info=srv.info)
            result["dtype"] = srv.dtype(args.served_name)
            result["run"] = asyncio.run(run_rounds(srv.base_url, prompts, args, tok))
    except Exception as e:  # noqa: BLE001 - reported in the results
        result["error"] = f"{type(e).__name__}: {e}"
        log(f"[guided] failed: {result['error'][:2000]}")
    write_results(result, out_path, t0, markdown)
