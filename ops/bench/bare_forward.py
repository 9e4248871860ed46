"""How fast is the model's own forward with no server? The eager transformers ceiling.

    python -m ops.bench.bare_forward [--batches 1,4,16,32,64] [--dtypes bfloat16,float32] [--out F]

For each dtype (bf16, fp32) and batch size B: prefill the 128-token benchmark prompt
replicated to B rows into a fresh DynamicCache, then time `steps` (64) decode steps, each
feeding back the argmax of the previous logits. decode tok/s = B * steps / decode time. This
is the ceiling a server's decode throughput at concurrency B could reach on this machine with
eager transformers (it has no scheduling, HTTP, sampling or detokenization costs, and
all rows are in lock step with no padding).

The TTFT baseline is batch 1: prefill of the 128-token prompt plus one decode step, the median
of `ttft_repeats` runs after a warmup. Note that a server's first streamed token is the argmax
of the prefill's logits, so it needs only the prefill: `prefill_b1_ms` is the tighter lower
bound of a server's TTFT, and a server can come in under `ttft_b1_ms`.

torch.set_num_threads(threads) (default 2) and torch.inference_mode throughout. ops.bench.run
runs it in a subprocess (ops.harness.baselines).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from ops.harness.load import parse_levels
from ops.harness.prompts import build_prompt_ids, default_model_dir
from ops.harness.results import emit_json

DEFAULT_BATCHES = (1, 4, 16, 32, 64)
DEFAULT_DTYPES = ("bfloat16", "float32")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class _Loop:
    """One dtype's model and its greedy prefill and decode steps on a DynamicCache."""

    def __init__(self, model_dir: str, dtype_name: str, ids: list[int]):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.ids = ids
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype_name))
        self.model.eval()

    def prefill(self, batch: int) -> tuple[Any, Any]:
        from transformers import DynamicCache

        input_ids = self.torch.tensor([self.ids] * batch, dtype=self.torch.long)
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].argmax(dim=-1, keepdim=True), out.past_key_values

    def decode_step(self, tok: Any, cache: Any) -> tuple[Any, Any]:
        out = self.model(input_ids=tok, past_key_values=cache, use_cache=True)
        return out.logits[:, -1, :].argmax(dim=-1, keepdim=True), out.past_key_values


def _ttft(loop: _Loop, repeats: int) -> dict[str, Any]:
    """Batch-1 prefill plus one decode step, the median of `repeats` after a warmup."""
    tok, cache = loop.prefill(1)
    for _ in range(4):  # warmup (first calls allocate and pick kernels)
        tok, cache = loop.decode_step(tok, cache)
    ttfts, prefills = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        tok, cache = loop.prefill(1)
        t1 = time.perf_counter()
        tok, cache = loop.decode_step(tok, cache)
        t2 = time.perf_counter()
        prefills.append(t1 - t0)
        ttfts.append(t2 - t0)
    return {
        "prefill_b1_ms": round(1000 * statistics.median(prefills), 2),
        "ttft_b1_ms": round(1000 * statistics.median(ttfts), 2),
        "ttft_b1_all_ms": [round(1000 * t, 2) for t in ttfts],
    }


def _batch(loop: _Loop, b: int, steps: int) -> dict[str, Any]:
    """Prefill B rows, then `steps` timed decode steps."""
    t0 = time.perf_counter()
    tok, cache = loop.prefill(b)
    t_prefill = time.perf_counter() - t0
    step_times = []
    t_dec0 = time.perf_counter()
    for _ in range(steps):
        s0 = time.perf_counter()
        tok, cache = loop.decode_step(tok, cache)
        step_times.append(time.perf_counter() - s0)
    t_dec = time.perf_counter() - t_dec0
    return {
        "prefill_ms": round(1000 * t_prefill, 1),
        "decode_s": round(t_dec, 3),
        "decode_tok_s": round(b * steps / t_dec, 2),
        "step_ms_p50": round(1000 * statistics.median(step_times), 2),
        "step_ms_max": round(1000 * max(step_times), 2),
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }


def run_bare_forward(
    model_dir: str,
    batches: Sequence[int] = DEFAULT_BATCHES,
    dtypes: Sequence[str] = DEFAULT_DTYPES,
    steps: int = 64,
    threads: int = 2,
    ttft_repeats: int = 5,
    prompt_tokens: int = 128,
    time_cap: float = 900.0,
) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    ids = build_prompt_ids(model_dir, prompt_tokens)
    out: dict[str, Any] = {
        "model_dir": model_dir, "prompt_tokens": len(ids), "decode_steps": steps, "threads": torch.get_num_threads(), "torch": torch.__version__,
        "platform": platform.platform(), "cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg(), "dtypes": {},
    }  # fmt: skip
    started = time.monotonic()
    for dtype_name in dtypes:
        loop = _Loop(model_dir, dtype_name, ids)
        with torch.inference_mode():
            res: dict[str, Any] = {"batches": {}, **_ttft(loop, ttft_repeats)}
            _log(f"[bare {dtype_name}] TTFT baseline (prefill 128 + 1 decode, b=1): {res['ttft_b1_ms']} ms (prefill {res['prefill_b1_ms']} ms)")
            for b in batches:
                if time.monotonic() - started > time_cap:
                    res["batches"][str(b)] = {"skipped": f"time cap {time_cap:.0f}s reached"}
                    continue
                res["batches"][str(b)] = entry = _batch(loop, b, steps)
                _log(f"[bare {dtype_name}] B={b}: decode {entry['decode_tok_s']} tok/s (step p50 {entry['step_ms_p50']} ms), prefill {entry['prefill_ms']} ms")
        out["dtypes"][dtype_name] = res
        del loop
    out["loadavg_end"] = os.getloadavg()
    out["elapsed_s"] = round(time.monotonic() - started, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=parse_levels, default=list(DEFAULT_BATCHES))
    p.add_argument("--dtypes", default=",".join(DEFAULT_DTYPES))
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default=None, help="local HF model directory (default: the embedded SmolLM2)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    model_dir = args.model or str(default_model_dir())
    result = run_bare_forward(model_dir, args.batches, [d for d in args.dtypes.split(",") if d], args.steps, args.threads)
    emit_json(result, args.out)


if __name__ == "__main__":
    main()
