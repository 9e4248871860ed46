"""How fast is Switchyard's own model path with no server? The bare native step.

    python -m ops.bench.bare_native [--variants native,transformers] [--batches 1,4,16,32,64] [--dtype bfloat16] [--out F]

The second baseline beside ops.bench.bare_forward (eager transformers): the same workload
(the 128-token benchmark prompt replicated to B rows, then `steps` decode steps feeding back
each row's argmax), run through a runner's model path on our paged KV cache exactly as the
server's steps run it, minus scheduling, sampling, HTTP and detokenization. Server tok/s over
this figure is the server's own overhead. The variants (`--variants`, comma separated) and
the device are ops.harness.native_step's.

Prefill: B chunks of 128 in one packed step (TTFT baseline: B=1). decode tok/s = B * steps /
decode time. torch.set_num_threads(threads) and torch.inference_mode throughout. ops.bench.run
(--bare-native) and ops.bench.overhead run it in a subprocess (ops.harness.baselines).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any

from ops.harness.load import parse_levels
from ops.harness.native_step import build_runner, measure, torch_gpu
from ops.harness.prompts import build_prompt_ids, default_model_dir
from ops.harness.results import cpu_model, emit_json

DEFAULT_BATCHES = (1, 4, 16, 32, 64)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _variant(model_dir: str, variant: str, ids: list[int], batches: list[int], dtype: str, steps: int, threads: int) -> dict[str, Any]:
    """Load one variant, warm it up, then its b=1 prefill and every batch's prefill and decode
    steps, each width warmed once before it is timed."""
    import torch

    started = time.perf_counter()
    runner, per_seq = build_runner(model_dir, variant, dtype, max(batches), len(ids), steps, threads)
    res: dict[str, Any] = {"load_s": round(time.perf_counter() - started, 1), "batches": {}}
    with torch.inference_mode():
        measure(runner, per_seq, ids, 1, 4)  # warm-up
        prefills = [measure(runner, per_seq, ids, 1, 1)["prefill_ms"] for _ in range(3)]
        res["prefill_b1_ms"] = statistics.median(prefills)
        for b in batches:
            # One unmeasured prefill and step at this width first: a shape's first use can cost a
            # second on a GPU (the B=8 baseline of ops/results/gpu-check-spec-stage-2026-11-27-h200.json
            # and of gpu-check-runner-time-2026-11-26-h200.json), which the server's warm-up pays apart.
            measure(runner, per_seq, ids, b, 1)
            res["batches"][str(b)] = entry = measure(runner, per_seq, ids, b, steps)
            _log(f"[bare-native {variant} {dtype}] B={b}: {entry['decode_tok_s']} tok/s (step p50 {entry['step_ms_p50']} ms), prefill {entry['prefill_ms']} ms")
    runner.close()
    return res


def run_bare_native(
    model_dir: str, variants: list[str], batches: list[int], dtype: str = "bfloat16", steps: int = 64, threads: int = 2, prompt_tokens: int = 128
) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    ids = build_prompt_ids(model_dir, prompt_tokens)
    out: dict[str, Any] = {
        "model_dir": model_dir, "dtype": dtype, "prompt_tokens": len(ids), "decode_steps": steps, "threads": threads,
        "torch": torch.__version__, "platform": platform.platform(), "cpu": cpu_model(), "gpu": torch_gpu(), "loadavg_start": os.getloadavg(), "variants": {},
    }  # fmt: skip
    for variant in variants:
        out["variants"][variant] = _variant(model_dir, variant, ids, batches, dtype, steps, threads)
    out["loadavg_end"] = os.getloadavg()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="native,transformers")
    p.add_argument("--batches", type=parse_levels, default=list(DEFAULT_BATCHES))
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default=None, help="local HF model directory (default: the embedded SmolLM2)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    model_dir = args.model or str(default_model_dir())
    result = run_bare_native(model_dir, [v for v in args.variants.split(",") if v], args.batches, args.dtype, args.steps, args.threads)
    emit_json(result, args.out)


if __name__ == "__main__":
    main()
