"""How fast is transformers serve --continuous-batching under the same sweep, alone?

    python -m ops.bench.peers [--levels 1,4] [--dtype auto] [--out F]

Starts `transformers serve --continuous-batching` on the embedded SmolLM2 (ops.harness.peers
says how it is made to produce exactly 64 tokens and why its KV cache is capped), runs the
closed-loop sweep of ops.harness.load against it and stops it. ops.bench.run runs the same
beside Switchyard with --peers (and llama-server with --llama-server).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ops.harness.load import OUTPUT_TOKENS, parse_levels, prompts_needed
from ops.harness.peers import run_transformers_serve
from ops.harness.prompts import PROMPT_TOKENS, build_prompts, default_model_dir
from ops.harness.results import RESULTS_DIR


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", type=parse_levels, default=[1, 4])
    p.add_argument("--requests-per-slot", type=int, default=2)
    p.add_argument("--min-requests", type=int, default=8)
    p.add_argument("--time-cap", type=float, default=180.0)
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--dtype", default="auto", help="transformers serve --dtype (auto = the weights' float32)")
    p.add_argument("--cb-num-blocks", type=int, default=80, help="transformers serve --cb-num-blocks (0: its own default)")
    p.add_argument("--cb-max-batch-tokens", type=int, default=512, help="transformers serve --cb-max-batch-tokens (0: its own default)")
    p.add_argument("--prompt-mode", choices=["unique", "fixed"], default="unique")
    p.add_argument("--model", default=None, help="local HF model directory (default: the embedded SmolLM2)")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model_dir = args.model or str(default_model_dir())
    prompts = build_prompts(model_dir, prompts_needed(args.levels, args.requests_per_slot, args.min_requests, args.warmup), PROMPT_TOKENS, args.prompt_mode)
    out_path = Path(args.out) if args.out else None
    log_dir = (out_path.parent if out_path else RESULTS_DIR) / "logs"
    result = run_transformers_serve(
        model_dir, prompts, args.levels, log_dir, dtype=args.dtype,
        cb_num_blocks=args.cb_num_blocks or None, cb_max_batch_tokens=args.cb_max_batch_tokens or None,
        max_tokens=OUTPUT_TOKENS, time_cap=args.time_cap, request_timeout=args.request_timeout,
        requests_per_slot=args.requests_per_slot, min_requests=args.min_requests,
        warmup_requests=args.warmup, expected_prompt_tokens=PROMPT_TOKENS,
    )  # fmt: skip
    text = json.dumps(result, indent=2)
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
