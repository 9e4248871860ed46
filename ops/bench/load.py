"""How does a server already running hold up under the closed-loop streaming sweep?

    python -m ops.bench.load --url http://127.0.0.1:8000 [--model NAME] [--extra-body '{"ignore_eos": true}'] [--levels 1,4]

The sweep of ops.harness.load (its docstring says what each figure means) against any
OpenAI-compatible /v1/completions endpoint: 128-token prompts, 64 tokens out, streamed, c
workers each keeping one request in flight. Prints the JSON, or writes it with --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from ops.harness.load import DEFAULT_LEVELS, OUTPUT_TOKENS, Target, parse_levels, prompts_needed, sweep
from ops.harness.prompts import PROMPT_TOKENS, build_prompts, default_model_dir
from ops.harness.servers import DEFAULT_SERVED_NAME


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=DEFAULT_SERVED_NAME, help="the request's model field ('' to leave it out)")
    p.add_argument("--extra-body", default='{"ignore_eos": true}', help="JSON merged into every request body")
    p.add_argument("--levels", type=parse_levels, default=list(DEFAULT_LEVELS))
    p.add_argument("--requests-per-slot", type=int, default=2, help="requests per level = max(this*c, --min-requests)")
    p.add_argument("--min-requests", type=int, default=8)
    p.add_argument("--time-cap", type=float, default=180.0, help="seconds per level after which no new request starts")
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--prompt-mode", choices=["unique", "fixed"], default="unique")
    p.add_argument("--tokenizer", default=None, help="model directory for the tokenizer (default: the embedded SmolLM2)")
    p.add_argument("--out", default=None, help="write the JSON here (default: stdout)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tok_dir = args.tokenizer or str(default_model_dir())
    n_prompts = prompts_needed(args.levels, args.requests_per_slot, args.min_requests, args.warmup)
    prompts = build_prompts(tok_dir, n_prompts, PROMPT_TOKENS, args.prompt_mode)
    target = Target("target", args.url, args.model or None, extra_body=json.loads(args.extra_body))
    result = asyncio.run(
        sweep(target, prompts, args.levels, OUTPUT_TOKENS, args.time_cap, args.request_timeout, args.requests_per_slot, args.min_requests, args.warmup, PROMPT_TOKENS)
    )
    result["config"]["prompt_mode"] = args.prompt_mode
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
