"""The sweep's markdown table (printed, and kept in the JSON under `markdown`): the bare
baselines, each server section's levels, and the ratios."""

from __future__ import annotations

from typing import Any

from ops.bench.run.ratios import HEADLINE_C, bare_native_tok_s, bare_tok_s
from ops.bench.run.sections import PEERS, sections
from ops.harness.results import fmt, loadavg_line

_LEVEL_HEAD = [
    "| c | requests | ok | tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | chunk gap p50 ms | chunk gap p99 ms | errors |",
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
]


def bare_forward_lines(bare: dict[str, Any]) -> list[str]:
    if not bare.get("dtypes"):
        return [f"Bare forward: {bare['error']}", ""] if bare.get("error") else []
    dtypes = list(bare["dtypes"])
    batches = sorted({int(b) for d in dtypes for b in bare["dtypes"][d]["batches"]})
    lines = ["### Bare forward (no server): decode tok/s", "", "| batch | " + " | ".join(dtypes) + " |", "|---:|" + "---:|" * len(dtypes)]
    lines += [f"| {b} | " + " | ".join(fmt(bare_tok_s(bare, d, b)) for d in dtypes) + " |" for b in batches]
    ttft = ", ".join(f"{d} {fmt(bare['dtypes'][d].get('ttft_b1_ms'))} ms (prefill alone {fmt(bare['dtypes'][d].get('prefill_b1_ms'))} ms)" for d in dtypes)
    return [*lines, "", "TTFT baseline (b=1, prefill 128 + 1 decode step): " + ttft, ""]


def bare_native_lines(result: dict[str, Any]) -> list[str]:
    bare = result.get("bare_native") or {}
    if bare.get("error"):
        return [f"Bare native step: {bare['error']}", ""]
    variants = list(bare.get("variants", {}))
    if not variants:
        return []
    batches = sorted({int(b) for v in variants for b in bare["variants"][v]["batches"]})
    lines = [f"### Bare native step (no server, {bare.get('dtype')}, {bare.get('cpu')}): decode tok/s", ""]
    lines += ["| batch | " + " | ".join(variants) + " |", "|---:|" + "---:|" * len(variants)]
    lines += [f"| {b} | " + " | ".join(fmt(bare_native_tok_s(result, v, b)) for v in variants) + " |" for b in batches]
    workload = "; ".join(f"B={b}: " + ", ".join(f"{v} {fmt(bare_native_tok_s(result, v, b, workload=True))}" for v in variants) for b in batches)
    return [
        *lines, "", "over the workload (prefill of B prompts plus the decode steps), tok/s: " + workload, "",
        "prefill b=1 (128 tokens): " + ", ".join(f"{v} {fmt(bare['variants'][v].get('prefill_b1_ms'))} ms" for v in variants),
        "start-up (load + compile): " + ", ".join(f"{v} {fmt(bare['variants'][v].get('load_s'))} s" for v in variants), "",
    ]  # fmt: skip


def section_lines(key: str, section: dict[str, Any]) -> list[str]:
    title = f"### {key} (dtype {section.get('dtype') or '?'})"
    if "sweep" not in section:
        return [title, "", f"not measured: {section.get('error') or section.get('skipped')}", ""]
    lines = [title, "", *_LEVEL_HEAD]
    for lv in section["sweep"]["levels"]:
        lines.append(
            f"| {lv['concurrency']} | {lv['requests']} | {lv['ok']} | {fmt(lv['output_tok_s'])} | {fmt(lv['ttft_ms']['p50'])} | {fmt(lv['ttft_ms']['p99'])} "
            f"| {fmt(lv['itl_req_ms']['p50'])} | {fmt(lv['itl_req_ms']['p99'])} | {fmt(lv['itl_chunk_ms']['p50'])} | {fmt(lv['itl_chunk_ms']['p99'])} | {lv['errors']} |"
        )
    if section.get("error"):
        lines.append(f"\nerror: {section['error'][:500]}")
    return [*lines, ""]


def _section_ratio_lines(result: dict[str, Any], key: str, r: dict[str, Any]) -> list[str]:
    hc = HEADLINE_C
    lines = [
        f"- {key}: tok/s c={hc} / bare bf16 b={hc} = {fmt(r.get(f'tok_s_c{hc}_over_bare_bf16_b{hc}'))}; "
        f"TTFT c=1 / bare bf16 TTFT = {fmt(r.get('ttft_c1_over_bare_bf16_ttft'))} "
        f"(/ bare bf16 prefill alone = {fmt(r.get('ttft_c1_over_bare_bf16_prefill'))}); "
        f"tok/s c={hc} / bare bf16 workload b={hc} = {fmt(r.get(f'tok_s_c{hc}_over_bare_bf16_workload_b{hc}'))}"
    ]
    for prefix, what in (("tok_s_over_bare_native[", "decode steps"), ("tok_s_over_bare_native_workload[", "workload")):
        native = next((v for k, v in r.items() if k.startswith(prefix)), None)
        if native:
            per_c = ", ".join(f"c={c}: {fmt(v)}" for c, v in native.items())
            lines.append(f"  - over the bare native step ({result.get('bare_native_baseline')}, {what}): " + per_c)
    return lines


def ratio_lines(result: dict[str, Any]) -> list[str]:
    ratios = result.get("ratios") or {}
    if not ratios:
        return []
    lines = ["### Ratios", ""]
    for key in sections(result):
        if ratios.get(key):
            lines += _section_ratio_lines(result, key, ratios[key])
    for peer in PEERS:
        if f"switchyard_over_{peer}_tok_s" in ratios:
            lines.append(f"- switchyard / {peer} tok/s per c: " + ", ".join(f"c={c}: {fmt(v)}" for c, v in ratios[f"switchyard_over_{peer}_tok_s"].items()))
    return [*lines, ""]


def markdown(result: dict[str, Any]) -> str:
    lines = bare_forward_lines(result.get("bare_forward") or {}) + bare_native_lines(result)
    for key in sections(result):
        if result.get(key):
            lines += section_lines(key, result[key])
    lines += ratio_lines(result)
    lines.append(loadavg_line(result))
    return "\n".join(lines)
