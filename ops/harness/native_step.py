"""A runner's model path stepped in a plain loop: the server's steps minus scheduling,
sampling, HTTP and detokenization (ops.bench.bare_native, step_ab, quant_quality).

Variants, `impl[+compile][+int8|+int4|+shipped][+buckets|+nographs][-nosmooth]`:
  native                   the native decoder, eager (on a GPU: decode steps as CUDA graphs)
  native+compile           a single row's decode step as one compiled graph (actors/runners/native/decode_graph.py)
  native                   dense weights (--quantization none), whatever the checkpoint ships
  native+int8, +int4       quantized linears: weight-only kernels up to 4 rows, the int8 GEMM past them
  native+shipped           the same kernels on the checkpoint's own quantized blocks (the default
                           server's weights for the embedded model on CPU, actors/runners/native/shipped.py)
  native+nographs          on a GPU, decode steps eager instead of CUDA graphs (--no-cuda-graphs)
  native+buckets           on a CPU, decode steps through the CUDA graphs' bucketed step, uncaptured
  transformers             the transformers path (paged attention through the interface)
  ...-nosmooth             a quantized variant loaded without smoothing (before/after figures)

The device is the runner's default (CUDA when torch sees one, else the CPU) unless a driver
names one (`step_ab --device`). On CUDA each step ends with a synchronize, so a time covers the
GPU's work, not only its launch.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

BLOCK = 16
NOSMOOTH = "-nosmooth"


def loading(variant: str) -> tuple[str, Any]:
    """A variant without its `-nosmooth` suffix, and the context its runner must load in: the
    suffix loads it without actors/runners/native/smoothing.py (the benchmarks' before/after)."""
    from actors.runners.native import smoothing

    nosmooth = variant.endswith(NOSMOOTH)
    return variant.removesuffix(NOSMOOTH), smoothing.alpha_while_loading(None if nosmooth else smoothing.ALPHA)


def variant_options(variant: str) -> tuple[str, dict[str, Any]]:
    """(model impl, TorchRunner options) of a variant without its `-nosmooth` suffix."""
    parts = variant.split("+")
    options: dict[str, Any] = {"quantization": "none"}
    for extra in parts[1:]:
        if extra == "compile":
            options["compile"] = True
        elif extra in ("int8", "int4", "shipped"):
            options["quantization"] = extra
        elif extra in ("buckets", "nographs"):
            options["cuda_graphs"] = extra == "buckets"
        else:
            raise SystemExit(f"unknown variant part {extra!r} in {variant!r}")
    return parts[0], options


def build_runner(
    model_dir: str, variant: str, dtype: str, max_batch: int, prompt_tokens: int, steps: int, threads: int, device: str | None = None
) -> tuple[Any, int]:
    """A loaded TorchRunner for `variant` on `device` (None: the runner's default) with KV blocks
    for `max_batch` rows of `prompt_tokens` plus `steps`, and the blocks per row.

    The KV cache is the server's default size where that holds the rows (the cache's shape is in
    inductor's cache key: a compiled variant then loads a server's graphs, and a server this
    one's, instead of compiling for minutes), and every compiled graph is in before a timed step."""
    from actors.runners.runner_config import RunnerConfig
    from actors.runners.torch_runner import TorchRunner
    from runtime.config import RuntimeConfig

    variant, context = loading(variant)
    impl, options = variant_options(variant)
    per_seq = -(-(prompt_tokens + steps + 8) // BLOCK)
    needed = per_seq * max_batch + 4
    runner = TorchRunner(
        Path(model_dir), RunnerConfig(device=device, dtype=dtype, kv_cache_gib=RuntimeConfig().kv_cache_gib, block_size=BLOCK, num_threads=threads, model_impl=impl, **options)
    )
    with context:
        runner.load()
    if runner.k_cache[0].shape[1] < needed * BLOCK:  # the default size is too small for these rows: as many blocks as they need
        runner = TorchRunner(Path(model_dir), RunnerConfig(device=device, dtype=dtype, num_kv_blocks=needed, block_size=BLOCK, num_threads=threads, model_impl=impl, **options))
        with context:
            runner.load()
    graph = runner.compile_in_background()
    # Every graph compiled before any timed step, as a warm server has swapped them in.
    if graph is not None and not (graph.wait_ready(1800) and graph.wait_rows_ready(1800) and graph.wait_mixed_ready(1800) and graph.wait_few_ready(1800)):
        raise SystemExit(f"{variant}: a decode graph did not compile (see the log)")
    bucketed = getattr(runner.model, "bucketed", None)
    if bucketed is not None and bucketed.capture:  # every batch bucket's CUDA graph now, as the server's warm-up does, never in a timed step
        bucketed.capture_all(runner.k_cache, runner.v_cache)
    return runner, per_seq


def step(runner: Any, seqs: list[tuple[int, int]], tables: list[list[int]], ids: Any) -> Any:
    """One step of (start, length) rows on their block tables; each row's greedy next token."""
    import torch

    built, positions = runner.model.build_step(seqs, tables, BLOCK, runner.k_cache, runner.v_cache)
    ends = (torch.tensor(seqs)[:, 1].cumsum(0) - 1).to(runner.device)
    logits = runner.model.forward(ids.to(runner.device), positions, built, ends, runner.k_cache, runner.v_cache)
    tokens = logits.argmax(dim=-1)
    if tokens.is_cuda:
        torch.cuda.synchronize()
    return tokens


def measure(runner: Any, per_seq: int, ids: list[int], batch: int, steps: int) -> dict[str, Any]:
    """`ids` prefilled at `batch` rows in one packed step, then `steps` decode steps."""
    import torch

    tables = [list(range(b * per_seq, (b + 1) * per_seq)) for b in range(batch)]
    n = len(ids)
    t0 = time.perf_counter()
    tok = step(runner, [(0, n)] * batch, tables, torch.tensor(ids * batch))
    t_prefill = time.perf_counter() - t0
    times = []
    for i in range(steps):
        s0 = time.perf_counter()
        tok = step(runner, [(n + i, 1)] * batch, tables, tok)
        times.append(time.perf_counter() - s0)
    return {
        "prefill_ms": round(1000 * t_prefill, 1),
        "decode_tok_s": round(batch * steps / sum(times), 2),
        "step_ms_p50": round(1000 * statistics.median(times), 2),
        "step_ms_max": round(1000 * max(times), 2),
    }


def torch_gpu() -> str | None:
    """The GPU torch steps on, None on a CPU."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None
