"""The bare baselines a server is held against, and the arithmetic that makes them comparable.

Owns: running ops.bench.bare_forward (eager transformers, no server) and ops.bench.bare_native
(the runner's own model path in a plain loop) in bounded subprocesses, each writing its JSON
to a temporary file beside the results, and `workload_tok_s`, a bare batch's tok/s over the
server's own workload (its prompts' prefill plus the decode steps).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ops.harness.processes import json_from_subprocess
from ops.harness.results import REPO_ROOT


def run_bare_forward(model_dir: str, batches: list[int], dtypes: list[str], steps: int, threads: int, out_dir: Path, timeout: float) -> dict[str, Any]:
    """ops.bench.bare_forward in a subprocess with a timeout: its JSON, or {"error"}."""
    tmp = out_dir / f".bare-{os.getpid()}.json.tmp"
    cmd = [
        sys.executable, "-m", "ops.bench.bare_forward",
        "--batches", ",".join(map(str, batches)), "--dtypes", ",".join(dtypes),
        "--steps", str(steps), "--threads", str(threads), "--model", model_dir, "--out", str(tmp),
    ]  # fmt: skip
    return json_from_subprocess("bare forward", cmd, tmp, REPO_ROOT, timeout)


def run_bare_native(
    model_dir: str, variants: str, batches: list[int], dtype: str, steps: int, threads: int, out_dir: Path, timeout: float
) -> dict[str, Any]:
    """ops.bench.bare_native for `variants` (comma separated) in a subprocess with a timeout."""
    tmp = out_dir / f".bare-native-{os.getpid()}.json.tmp"
    cmd = [
        sys.executable, "-m", "ops.bench.bare_native", "--variants", variants, "--batches", ",".join(map(str, batches)),
        "--dtype", dtype, "--steps", str(steps), "--threads", str(threads), "--model", model_dir, "--out", str(tmp),
    ]  # fmt: skip
    return json_from_subprocess("bare native", cmd, tmp, REPO_ROOT, timeout)


def workload_tok_s(entry: dict[str, Any], batch: int, steps: int) -> float | None:
    """A bare batch's tok/s over the server's own workload: its B prompts' prefill plus the
    decode steps, where `decode_tok_s` counts the decode steps alone.

    Why both: each benchmark request is a 128-token prompt and 64 output tokens, so the server
    prefills 2 prompt tokens per token it streams, and at batch 32 that prefill is a large
    share of the bare work (ops/results/sweep-c1-c32-quantized-llama-2026-11-24-epyc-zen4.json
    has the split). Server tok/s over the decode-only figure therefore cannot reach 1 however
    small the server's own cost; over this figure it can, and the gap left is the server's. The
    first token of a row comes from its prefill, so `steps` tokens need the prefill and
    steps - 1 decode steps.
    """
    prefill_ms, decode_tok_s = entry.get("prefill_ms"), entry.get("decode_tok_s")
    if not prefill_ms or not decode_tok_s or steps < 1:
        return None
    decode_s = batch * steps / decode_tok_s * (steps - 1) / steps
    return round(batch * steps / (prefill_ms / 1000 + decode_s), 2)
