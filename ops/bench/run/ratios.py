"""Each server section of a sweep over the baselines measured in the same run: pure
arithmetic on the results dict (tests/unit/test_bench_ratios.py holds it to account).

- over the bare eager forward (bf16, fp32 and the server's own dtype) at batch c, decode-only
  and over the same workload (prefill plus decode, ops.harness.baselines.workload_tok_s);
- over the bare native step (`--bare-native-baseline` variant) at batch c, both ways;
- TTFT at c=1 over the bare TTFT baseline and over the bare prefill alone;
- Switchyard over each peer, per level.
"""

from __future__ import annotations

from typing import Any

from ops.bench.run.sections import PEERS, sections
from ops.harness.baselines import workload_tok_s
from ops.harness.stats import ratio

HEADLINE_C = 32


def level(section: dict[str, Any] | None, c: int) -> dict[str, Any] | None:
    """A section's sweep level at concurrency c, None if it has none."""
    if not section or "sweep" not in section:
        return None
    return next((lv for lv in section["sweep"]["levels"] if lv["concurrency"] == c), None)


def _field(lv: dict[str, Any] | None, key: str) -> float | None:
    return lv[key] if lv else None


def _ttft_p50(lv: dict[str, Any] | None) -> float | None:
    return lv["ttft_ms"]["p50"] if lv else None


def bare_tok_s(bare: dict[str, Any], dtype: str, b: int, workload: bool = False) -> float | None:
    """The bare forward's tok/s at batch b in `dtype`: decode-only, or over the workload."""
    entry = bare.get("dtypes", {}).get(dtype, {}).get("batches", {}).get(str(b), {})
    return workload_tok_s(entry, b, bare.get("decode_steps", 0)) if workload else entry.get("decode_tok_s")


def bare_native_tok_s(result: dict[str, Any], variant: str, batch: int, workload: bool = False) -> float | None:
    """The bare native step's tok/s for `variant` at `batch`: decode-only, or over the workload."""
    entry = (result.get("bare_native") or {}).get("variants", {}).get(variant, {}).get("batches", {}).get(str(batch), {})
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


def _per_level(bare: dict[str, Any], section: dict[str, Any], server_dtype: str | None) -> dict[str, Any]:
    """Per level, against the bare batch of the same size, in both dtypes and in the server's own."""
    per_level = {}
    for lv in section["sweep"]["levels"]:
        c = lv["concurrency"]
        per_level[str(c)] = {
            "over_bare_bf16": ratio(lv["output_tok_s"], bare_tok_s(bare, "bfloat16", c)),
            "over_bare_fp32": ratio(lv["output_tok_s"], bare_tok_s(bare, "float32", c)),
            "over_bare_same_dtype": ratio(lv["output_tok_s"], bare_tok_s(bare, server_dtype, c)) if server_dtype else None,
        }
    return per_level


def section_ratios(result: dict[str, Any], section: dict[str, Any]) -> dict[str, Any]:
    """One server section over the baselines of its run."""
    bare = result.get("bare_forward") or {}
    bf16 = bare.get("dtypes", {}).get("bfloat16", {})
    r: dict[str, Any] = {}
    if result.get("bare_native", {}).get("variants"):
        baseline = result["bare_native_baseline"]
        r[f"tok_s_over_bare_native[{baseline}]_per_level"] = ratios_over_bare_native(result, section, baseline)
        r[f"tok_s_over_bare_native_workload[{baseline}]_per_level"] = ratios_over_bare_native(result, section, baseline, workload=True)
    lv_hi, lv1 = level(section, HEADLINE_C), level(section, 1)
    # The headline numbers: tok/s at c=32 over bare bf16 batch 32, TTFT at c=1 over bare bf16 TTFT.
    r[f"tok_s_c{HEADLINE_C}_over_bare_bf16_b{HEADLINE_C}"] = ratio(_field(lv_hi, "output_tok_s"), bare_tok_s(bare, "bfloat16", HEADLINE_C))
    # The same over the bare batch's prefill plus decode (ops.harness.baselines.workload_tok_s says why).
    r[f"tok_s_c{HEADLINE_C}_over_bare_bf16_workload_b{HEADLINE_C}"] = ratio(_field(lv_hi, "output_tok_s"), bare_tok_s(bare, "bfloat16", HEADLINE_C, workload=True))
    r["ttft_c1_over_bare_bf16_ttft"] = ratio(_ttft_p50(lv1), bf16.get("ttft_b1_ms"))
    # The first streamed token needs only the prefill: the tighter floor.
    r["ttft_c1_over_bare_bf16_prefill"] = ratio(_ttft_p50(lv1), bf16.get("prefill_b1_ms"))
    server_dtype = section.get("dtype")
    r["tok_s_over_bare_per_level"] = _per_level(bare, section, server_dtype)
    if server_dtype:
        r["ttft_c1_over_bare_same_dtype_ttft"] = ratio(_ttft_p50(lv1), bare.get("dtypes", {}).get(server_dtype, {}).get("ttft_b1_ms"))
    return r


def compute_ratios(result: dict[str, Any]) -> dict[str, Any]:
    """Every server section's ratios, and Switchyard over each peer per level."""
    ratios: dict[str, Any] = {}
    for section_name in sections(result):
        section = result.get(section_name)
        if section and "sweep" in section:
            ratios[section_name] = section_ratios(result, section)
    sy = result.get("switchyard")
    for peer in PEERS:
        other = result.get(peer)
        if sy and other and "sweep" in sy and "sweep" in other:
            ratios[f"switchyard_over_{peer}_tok_s"] = {
                str(lv["concurrency"]): ratio(lv["output_tok_s"], (level(other, lv["concurrency"]) or {}).get("output_tok_s")) for lv in sy["sweep"]["levels"]
            }
    return ratios
