"""The sweep's flags and the order of its sections: bare baselines, Switchyard, its variants,
the peers; then the ratios and the table."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import ops.bench.run
from ops.bench.run.ratios import compute_ratios
from ops.bench.run.report import markdown
from ops.bench.run.sections import VARIANT_PREFIX, bare_sections, parse_variants, run_switchyard
from ops.harness.load import DEFAULT_LEVELS, OUTPUT_TOKENS, parse_levels, prompts_needed
from ops.harness.peers import run_llama_server, run_transformers_serve
from ops.harness.prompts import PROMPT_TOKENS, build_prompts, default_model_dir, has_bos, load_tokenizer
from ops.harness.results import start_run, utc_now, wait_for_quiet, write_results
from ops.harness.servers import model_server_args


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=ops.bench.run.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", type=parse_levels, default=list(DEFAULT_LEVELS), help="concurrency levels (default 1,4,16,32,64)")
    p.add_argument("--peers", action="store_true", help="also sweep transformers serve --continuous-batching")
    p.add_argument("--llama-server", default=None, help="path of a llama-server binary: also sweep it (see ops/bench/README.md for the build)")
    p.add_argument("--out", default=None, help="results JSON (default ops/results/<UTC time>.json)")
    p.add_argument("--model", default=None, help="local HF model directory or GGUF file (llama-server then serves the same file) for every section (default: the embedded SmolLM2)")
    p.add_argument("--served-name", default=None, help="the request's model field for Switchyard (default: smollm2-135m-instruct, or the --model directory's name)")
    p.add_argument("--server-args", default="", help="extra `switchyard serve` arguments, one shell-quoted string, e.g. '--dtype bfloat16 --num-threads 2'")
    p.add_argument("--requests-per-slot", type=int, default=2, help="requests per level = max(this * c, --min-requests)")
    p.add_argument("--min-requests", type=int, default=8)
    p.add_argument("--time-cap", type=float, default=180.0, help="seconds per level after which no new request starts")
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--warmup", type=int, default=2, help="unmeasured requests before each server's sweep")
    p.add_argument("--prompt-mode", choices=["unique", "fixed"], default="unique", help="unique: a per-request header defeats prefix caching (default); fixed: one text for all")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--skip-bare", action="store_true")
    p.add_argument("--skip-switchyard", action="store_true")
    p.add_argument("--bare-from", default=None, help="reuse a bare-forward result instead of measuring: an ops.bench.bare_forward JSON or an ops.bench.run results JSON")
    p.add_argument("--bare-batches", type=parse_levels, default=None, help="default: the --levels")
    p.add_argument("--bare-dtypes", default="bfloat16,float32")
    p.add_argument("--bare-steps", type=int, default=OUTPUT_TOKENS)
    p.add_argument("--bare-threads", type=int, default=2)
    p.add_argument("--bare-timeout", type=float, default=1200.0)
    p.add_argument("--bare-native", default=None, help="also the bare native step baseline (ops.bench.bare_native) for these variants, e.g. native,native+int4,transformers")
    p.add_argument("--bare-native-baseline", default="native", help="the bare native variant the servers' tok/s are divided by")
    p.add_argument("--switchyard-variants", default="", help="more Switchyard sections, 'name[@checkout]=server args;...', e.g. 'hf=--model-impl transformers;before@/tmp/wt=--spec-decoding off' (@: that checkout's code)")
    p.add_argument("--peer-dtype", default="match", help="transformers serve --dtype; 'match' = the dtype Switchyard reported (else auto)")
    p.add_argument("--cb-num-blocks", type=int, default=80, help="transformers serve --cb-num-blocks (pages of 256 tokens; 0: its own default)")
    p.add_argument("--cb-max-batch-tokens", type=int, default=512, help="transformers serve --cb-max-batch-tokens (0: its own default)")
    p.add_argument("--quiet-load", type=float, default=None, help="before each section, wait until the 1-min load average is at most this")
    p.add_argument("--quiet-wait", type=float, default=300.0, help="the longest such wait, seconds (then it goes on and records it)")
    return p.parse_args(argv)


def _model(args: argparse.Namespace) -> tuple[str, str]:
    """(model directory, the requests' model field) for every section."""
    _, served_name = model_server_args(args.model, args.served_name)
    if args.model and args.model.endswith(".gguf"):  # converted into the store here, before any server starts
        from runtime.model_store import resolve_model

        return str(resolve_model(args.model)[1]), served_name
    return (str(Path(args.model).resolve()) if args.model else str(default_model_dir())), served_name


def _servers(result: dict[str, Any], args: argparse.Namespace, served_name: str, prompts: list[str], log_dir: Path, settle: Any, sweep_kwargs: dict[str, Any]) -> None:
    """Switchyard, its variants, then the peers, each under the same sweep, into `result`."""
    if not args.skip_switchyard:
        settle("switchyard")
        result["switchyard"] = run_switchyard(args.model, served_name, prompts, args.levels, log_dir, shlex.split(args.server_args), args.startup_timeout, **sweep_kwargs)
    for name, (checkout, extra) in parse_variants(args.switchyard_variants).items():
        settle(VARIANT_PREFIX + name)
        variant_args = [*shlex.split(args.server_args), *extra]
        result[VARIANT_PREFIX + name] = run_switchyard(
            args.model, served_name, prompts, args.levels, log_dir / name, variant_args, args.startup_timeout, checkout=checkout, **sweep_kwargs
        )
    if args.peers:
        settle("transformers_serve")
        peer_dtype = args.peer_dtype
        if peer_dtype == "match":
            peer_dtype = (result.get("switchyard") or {}).get("dtype") or "auto"
        result["transformers_serve"] = run_transformers_serve(
            result["model_dir"], prompts, args.levels, log_dir, dtype=peer_dtype, cb_num_blocks=args.cb_num_blocks or None,
            cb_max_batch_tokens=args.cb_max_batch_tokens or None, startup_timeout=args.startup_timeout, **sweep_kwargs,
        )  # fmt: skip
    if args.llama_server:
        settle("llama_server")
        gguf = Path(args.model).resolve() if args.model and args.model.endswith(".gguf") else None  # the same file; else the embedded one
        result["llama_server"] = run_llama_server(args.llama_server, prompts, args.levels, log_dir, startup_timeout=args.startup_timeout, gguf=gguf, **sweep_kwargs)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out_path, log_dir = start_run(args.out, "")
    model_dir, served_name = _model(args)
    tok = load_tokenizer(model_dir)
    n_prompts = prompts_needed(args.levels, args.requests_per_slot, args.min_requests, args.warmup)
    prompts = build_prompts(model_dir, n_prompts, PROMPT_TOKENS, args.prompt_mode)
    sweep_kwargs = dict(
        max_tokens=OUTPUT_TOKENS, time_cap=args.time_cap, request_timeout=args.request_timeout, requests_per_slot=args.requests_per_slot,
        min_requests=args.min_requests, warmup_requests=args.warmup, expected_prompt_tokens=PROMPT_TOKENS,
    )  # fmt: skip
    result: dict[str, Any] = {
        "started_utc": utc_now(), "argv": sys.argv[1:] if argv is None else argv, "model_dir": model_dir, "served_name": served_name,
        "prompt": {"tokens": PROMPT_TOKENS, "mode": args.prompt_mode, "distinct": len(set(prompts)), "tokenizer_adds_bos": has_bos(tok), "example": prompts[0]},
        "output_tokens": OUTPUT_TOKENS, "levels": args.levels, "cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg(),
    }  # fmt: skip
    t_start = time.monotonic()
    waits: dict[str, Any] = {}
    result["quiet_waits"] = waits

    def settle(section: str) -> None:
        if args.quiet_load is not None:
            waits[section] = wait_for_quiet(args.quiet_load, args.quiet_wait)

    bare_sections(result, args, model_dir, out_path.parent, settle)
    _servers(result, args, served_name, prompts, log_dir, settle, sweep_kwargs)
    result["ratios"] = compute_ratios(result)
    write_results(result, out_path, t_start, markdown)
