"""run.py's pieces for the native model paths: the bare native step baseline and Switchyard
variants (one server per model-path configuration) in the same run.

Owns: running ops.bench.bare_native in a bounded subprocess, parsing `--switchyard-variants`
("name=server args;name=server args"), the bare-native markdown table, and each server
section's tok/s over the bare native step at the same batch size (the server's own overhead).
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


def bare_native_tok_s(result: dict[str, Any], variant: str, batch: int) -> float | None:
    entry = (result.get("bare_native") or {}).get("variants", {}).get(variant, {}).get("batches", {}).get(str(batch), {})
    return entry.get("decode_tok_s")


def ratios_over_bare_native(result: dict[str, Any], section: dict[str, Any], baseline: str) -> dict[str, float | None]:
    """Per level: the section's tok/s over the bare native step (variant `baseline`) at batch c."""
    out: dict[str, float | None] = {}
    for lv in section.get("sweep", {}).get("levels", []):
        base = bare_native_tok_s(result, baseline, lv["concurrency"])
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
    lines.append("prefill b=1 (128 tokens): " + ", ".join(f"{v} {fmt(bare['variants'][v].get('prefill_b1_ms'))} ms" for v in variants))
    lines.append("start-up (load + compile): " + ", ".join(f"{v} {fmt(bare['variants'][v].get('load_s'))} s" for v in variants))
    lines.append("")
    return lines
