"""The bare native step: Switchyard's own model paths in a plain loop, no server, greedy.

The second baseline beside ops.bench.bare_forward (eager transformers): the same workload
(the 128-token benchmark prompt replicated to B rows, then `steps` decode steps feeding back
each row's argmax), run through a runner's model path on our paged KV cache exactly as the
server's steps run it, minus scheduling, sampling, HTTP and detokenization. Server tok/s over
this figure is the server's own overhead.

Variants (`--variants`, comma separated; each `impl[+compile][+int8|+int4][+buckets|+nographs]`):
  native                   the native decoder, eager (on a GPU: decode steps as CUDA graphs)
  native+compile           a single row's decode step as one compiled graph (actors/runners/native/decode_graph.py)
  native+int8, +int4       quantized linears: weight-only kernels up to 4 rows, the int8 GEMM past them
  native+nographs          on a GPU, decode steps eager instead of CUDA graphs (--no-cuda-graphs)
  native+buckets           on a CPU, decode steps through the CUDA graphs' bucketed step, uncaptured
  transformers             today's transformers path (paged attention through the interface)
  ...-nosmooth             a quantized variant loaded without smoothing (before/after figures)

The device is the runner's default: CUDA when torch sees one, else the CPU. On CUDA each timed
step ends with a synchronize, so a time covers the GPU's work, not only its launch.

Prefill: B chunks of 128 in one packed step (TTFT baseline: B=1). decode tok/s = B * steps /
decode time. torch.set_num_threads(threads) and torch.inference_mode throughout.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any

DEFAULT_BATCHES = (1, 4, 16, 32, 64)
BLOCK = 16
NOSMOOTH = "-nosmooth"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def loading(variant: str) -> tuple[str, Any]:
    """A variant without its `-nosmooth` suffix, and the context its runner must load in: the
    suffix loads it without actors/runners/native/smoothing.py (the benchmarks' before/after)."""
    from actors.runners.native import smoothing

    nosmooth = variant.endswith(NOSMOOTH)
    return variant.removesuffix(NOSMOOTH), smoothing.alpha_while_loading(None if nosmooth else smoothing.ALPHA)


def _variant_options(variant: str) -> tuple[str, dict[str, Any]]:
    parts = variant.split("+")
    options: dict[str, Any] = {}
    for extra in parts[1:]:
        if extra == "compile":
            options["compile"] = True
        elif extra in ("int8", "int4"):
            options["quantization"] = extra
        elif extra in ("buckets", "nographs"):
            options["cuda_graphs"] = extra == "buckets"
        else:
            raise SystemExit(f"unknown variant part {extra!r} in {variant!r}")
    return parts[0], options


def _runner(model_dir: str, variant: str, dtype: str, max_batch: int, prompt_tokens: int, steps: int, threads: int) -> Any:
    from actors.runners.torch_runner import TorchRunner

    variant, context = loading(variant)
    impl, options = _variant_options(variant)
    per_seq = -(-(prompt_tokens + steps + 8) // BLOCK)
    runner = TorchRunner(
        model_dir, dtype=dtype, num_kv_blocks=per_seq * max_batch + 4, block_size=BLOCK, num_threads=threads, model_impl=impl, **options
    )
    with context:
        runner.load()
    return runner, per_seq


def _step(runner: Any, seqs: list[tuple[int, int]], tables: list[list[int]], ids: Any) -> Any:
    import torch

    step, positions = runner.model.build_step(seqs, tables, BLOCK, runner.k_cache, runner.v_cache)
    ends = (torch.tensor(seqs)[:, 1].cumsum(0) - 1).to(runner.device)
    logits = runner.model.forward(ids.to(runner.device), positions, step, ends, runner.k_cache, runner.v_cache)
    tokens = logits.argmax(dim=-1)
    if tokens.is_cuda:
        torch.cuda.synchronize()
    return tokens


def measure(runner: Any, per_seq: int, ids: list[int], batch: int, steps: int) -> dict[str, Any]:
    import torch

    tables = [list(range(b * per_seq, (b + 1) * per_seq)) for b in range(batch)]
    n = len(ids)
    t0 = time.perf_counter()
    tok = _step(runner, [(0, n)] * batch, tables, torch.tensor(ids * batch))
    t_prefill = time.perf_counter() - t0
    times = []
    for i in range(steps):
        s0 = time.perf_counter()
        tok = _step(runner, [(n + i, 1)] * batch, tables, tok)
        times.append(time.perf_counter() - s0)
    return {
        "prefill_ms": round(1000 * t_prefill, 1),
        "decode_tok_s": round(batch * steps / sum(times), 2),
        "step_ms_p50": round(1000 * statistics.median(times), 2),
        "step_ms_max": round(1000 * max(times), 2),
    }


def run_bare_native(
    model_dir: str, variants: list[str], batches: list[int], dtype: str = "bfloat16", steps: int = 64, threads: int = 2, prompt_tokens: int = 128
) -> dict[str, Any]:
    import torch

    from ops.bench.prompt import build_prompt_ids

    torch.set_num_threads(threads)
    ids = build_prompt_ids(model_dir, prompt_tokens)
    out: dict[str, Any] = {
        "model_dir": model_dir, "dtype": dtype, "prompt_tokens": len(ids), "decode_steps": steps, "threads": threads,
        "torch": torch.__version__, "platform": platform.platform(), "cpu": _cpu_model(), "gpu": _gpu_model(), "loadavg_start": os.getloadavg(), "variants": {},
    }  # fmt: skip
    for variant in variants:
        started = time.perf_counter()
        runner, per_seq = _runner(model_dir, variant, dtype, max(batches), prompt_tokens, steps, threads)
        res: dict[str, Any] = {"load_s": round(time.perf_counter() - started, 1), "batches": {}}
        with torch.inference_mode():
            measure(runner, per_seq, ids, 1, 4)  # warm-up
            prefills = [measure(runner, per_seq, ids, 1, 1)["prefill_ms"] for _ in range(3)]
            res["prefill_b1_ms"] = statistics.median(prefills)
            for b in batches:
                res["batches"][str(b)] = entry = measure(runner, per_seq, ids, b, steps)
                _log(f"[bare-native {variant} {dtype}] B={b}: {entry['decode_tok_s']} tok/s (step p50 {entry['step_ms_p50']} ms), prefill {entry['prefill_ms']} ms")
        out["variants"][variant] = res
        runner.close()
    out["loadavg_end"] = os.getloadavg()
    return out


def _gpu_model() -> str | None:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def _cpu_model() -> str:
    """/proc/cpuinfo's model name and CPU family: lscpu names Zen 4 (family 25) and Zen 5 (26)
    alike ("AMD EPYC") on these VMs, and their speeds differ by 1.6x or more."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor()
    return f"{name} (family {fields['cpu family']})" if "cpu family" in fields else name


def main(argv: list[str] | None = None) -> None:
    from ops.bench.bare_forward import emit_json
    from ops.bench.load import parse_levels
    from ops.bench.prompt import default_model_dir

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
