"""run.py's pieces for the native model paths: the bare native step baseline and Switchyard
variants (one server per model-path configuration) in the same run.

Owns: running ops.bench.bare_native in a bounded subprocess, parsing `--switchyard-variants`
("name=server args;name=server args"), the bare-native markdown table, and each server
section's tok/s over the bare native step at the same batch size, both decode-only and over the
same workload (`workload_tok_s`).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from ops.bench.procs import json_from_subprocess

REPO_ROOT = Path(__file__).resolve().parents[2]
VARIANT_PREFIX = "switchyard:"  # results key of a variant's section: "switchyard:<name>"
SECTIONS = ("switchyard", "transformers_serve", "llama_server")


def sections(result: dict[str, Any]) -> list[str]:
    """The server sections of a run: Switchyard, its variants, then the peers."""
    variants = [k for k in result if k.startswith(VARIANT_PREFIX)]
    return [SECTIONS[0], *variants, *SECTIONS[1:]]


def parse_variants(spec: str) -> dict[str, list[str]]:
    """'native=--model-impl native;hf=--model-impl transformers' → {name: server args}."""
    out: dict[str, list[str]] = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, args = part.partition("=")
        if not name.strip() or not _:
            raise SystemExit(f"--switchyard-variants: {part!r} is not name=server args")
        out[name.strip()] = shlex.split(args)
    return out


def run_bare_native(
    model_dir: str, variants: str, batches: list[int], dtype: str, steps: int, threads: int, out_dir: Path, timeout: float
) -> dict[str, Any]:
    tmp = out_dir / f".bare-native-{os.getpid()}.json.tmp"
    cmd = [
        sys.executable, "-m", "ops.bench.bare_native", "--variants", variants, "--batches", ",".join(map(str, batches)),
        "--dtype", dtype, "--steps", str(steps), "--threads", str(threads), "--model", model_dir, "--out", str(tmp),
    ]  # fmt: skip
    return json_from_subprocess("bare native", cmd, tmp, REPO_ROOT, timeout)


def bare_native_section(result: dict[str, Any], args: Any, model_dir: str, out_dir: Path) -> None:
    """run.py's --bare-native: the baseline's results and its name into `result`."""
    result["bare_native_baseline"] = args.bare_native_baseline
    batches = args.bare_batches or args.levels
    result["bare_native"] = run_bare_native(model_dir, args.bare_native, batches, "bfloat16", args.bare_steps, args.bare_threads, out_dir, args.bare_timeout)


def workload_tok_s(entry: dict[str, Any], batch: int, steps: int) -> float | None:
    """A bare batch's tok/s over the server's own workload: its B prompts' prefill plus the
    decode steps, where `decode_tok_s` counts the decode steps alone.

    Why both: each benchmark request is a 128-token prompt and 64 output tokens, so the server
    prefills 2 prompt tokens per token it streams, and at batch 32 here that prefill is ~40% of
    the bare work (a 32 x 128 prefill 3.3 s against 5.4 s of decode, bf16 native, EPYC). Server
    tok/s over the decode-only figure therefore cannot reach 1 however small the server's own
    cost; over this figure it can, and the gap left is the server's. The first token of a row
    comes from its prefill, so `steps` tokens need the prefill and steps - 1 decode steps.
    """
    prefill_ms, decode_tok_s = entry.get("prefill_ms"), entry.get("decode_tok_s")
    if not prefill_ms or not decode_tok_s or steps < 1:
        return None
    decode_s = batch * steps / decode_tok_s * (steps - 1) / steps
    return round(batch * steps / (prefill_ms / 1000 + decode_s), 2)


def _bare_native_entry(result: dict[str, Any], variant: str, batch: int) -> dict[str, Any]:
    return (result.get("bare_native") or {}).get("variants", {}).get(variant, {}).get("batches", {}).get(str(batch), {})


def bare_native_tok_s(result: dict[str, Any], variant: str, batch: int, workload: bool = False) -> float | None:
    entry = _bare_native_entry(result, variant, batch)
    if workload:
        return workload_tok_s(entry, batch, (result.get("bare_native") or {}).get("decode_steps", 0))
    return entry.get("decode_tok_s")


def ratios_over_bare_native(result: dict[str, Any], section: dict[str, Any], baseline: str, workload: bool = False) -> dict[str, float | None]:
    """Per level: the section's tok/s over the bare native step (variant `baseline`) at batch c,
    decode-only or (`workload`) over the same prefill-plus-decode work."""
    out: dict[str, float | None] = {}
    for lv in section.get("sweep", {}).get("levels", []):
        base = bare_native_tok_s(result, baseline, lv["concurrency"], workload)
        out[str(lv["concurrency"])] = round(lv["output_tok_s"] / base, 3) if base else None
    return out


def markdown(result: dict[str, Any], fmt: Any) -> list[str]:
    bare = result.get("bare_native") or {}
    if bare.get("error"):
        return [f"Bare native step: {bare['error']}", ""]
    variants = list(bare.get("variants", {}))
    if not variants:
        return []
    batches = sorted({int(b) for v in variants for b in bare["variants"][v]["batches"]})
    lines = [f"### Bare native step (no server, {bare.get('dtype')}, {bare.get('cpu')}): decode tok/s", ""]
    lines += ["| batch | " + " | ".join(variants) + " |", "|---:|" + "---:|" * len(variants)]
    for b in batches:
        lines.append(f"| {b} | " + " | ".join(fmt(bare_native_tok_s(result, v, b)) for v in variants) + " |")
    lines.append("")
    lines.append("over the workload (prefill of B prompts plus the decode steps), tok/s: " + "; ".join(
        f"B={b}: " + ", ".join(f"{v} {fmt(bare_native_tok_s(result, v, b, workload=True))}" for v in variants) for b in batches
    ))  # fmt: skip
    lines.append("")
    lines.append("prefill b=1 (128 tokens): " + ", ".join(f"{v} {fmt(bare['variants'][v].get('prefill_b1_ms'))} ms" for v in variants))
    lines.append("start-up (load + compile): " + ", ".join(f"{v} {fmt(bare['variants'][v].get('load_s'))} s" for v in variants))
    lines.append("")
    return lines
