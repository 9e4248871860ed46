"""The guided benchmark's summaries: per variant over all its blocks, the ratios to the
unconstrained runs and to each variant's baseline (per round too), and the markdown table."""

from __future__ import annotations

import json
import statistics
from typing import Any

from ops.bench.guided.workload import BASELINE, TARGET_RATIO, Result
from ops.harness.results import loadavg_line
from ops.harness.stats import error_kinds, ms, percentile


def summarize(results: list[Result], wall: float, max_tokens: int) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    tokens = sum(r.completion_tokens for r in ok)
    finishes: dict[str, int] = {}
    for r in ok:
        finishes[str(r.finish)] = finishes.get(str(r.finish), 0) + 1
    lat = [r.end - r.start for r in ok]

    def mean(xs: list[int]) -> float | None:
        return round(statistics.fmean(xs), 1) if xs else None

    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "error_kinds": error_kinds(results),
        "wall_s": round(wall, 3),
        "completion_tokens": tokens,
        "output_tok_s": round(tokens / wall, 2) if wall > 0 else None,
        "latency_ms": {"p50": ms(percentile(lat, 50), 1), "p99": ms(percentile(lat, 99), 1)},
        "short_of_max_tokens": sum(1 for r in ok if r.completion_tokens < max_tokens),
        "finish": finishes,
        "off_format": sum(r.off_format for r in ok),
        "prompt_tokens_mean": mean([r.prompt_tokens for r in ok if r.prompt_tokens is not None]),
        "cached_tokens_mean": mean([r.cached_tokens for r in ok if r.cached_tokens is not None]),
    }


def _div(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def add_ratios(out: dict[str, Any]) -> None:
    """Per variant: tok/s over unconstrained (`ratio`) and over unconstrained_long
    (`ratio_long`); for a constrained variant, over its BASELINE (`ratio_to_baseline`, the
    figure the 15% target applies to) and the same per round (`round_ratio`)."""
    tok_s = {v: s["output_tok_s"] for v, s in out["variants"].items()}
    per_round: dict[int, dict[str, float]] = {}
    for b in out["blocks"]:
        if b["output_tok_s"] and b["ok"] == b["requests"]:
            per_round.setdefault(b["round"], {})[b["variant"]] = b["output_tok_s"]
    for v, s in out["variants"].items():
        s["ratio"] = _div(tok_s[v], tok_s["unconstrained"])
        s["ratio_long"] = _div(tok_s[v], tok_s["unconstrained_long"])
        base = BASELINE.get(v)
        s["baseline"] = base
        s["ratio_to_baseline"] = _div(tok_s[v], tok_s[base]) if base else None
        s["meets_target"] = None if s["ratio_to_baseline"] is None else s["ratio_to_baseline"] >= TARGET_RATIO
        rr = sorted(r[v] / r[base] for r in per_round.values() if base and v in r and base in r)
        s["round_ratio"] = {"min": round(rr[0], 3), "median": round(statistics.median(rr), 3), "max": round(rr[-1], 3), "n": len(rr)} if rr else None


def _f(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3f}" if abs(x) < 2 else f"{x:.2f}"
    return str(x)


def _variant_row(v: str, s: dict[str, Any]) -> str:
    rr = s.get("round_ratio")
    rr_text = f"{_f(rr['min'])} / {_f(rr['median'])} / {_f(rr['max'])}" if rr else "–"

    def mark(base: str, x: Any) -> str:
        return f"**{_f(x)}**" if s.get("baseline") == base else _f(x)

    return (
        f"| {v} | {s['requests']} | {s['ok']} | {_f(s['output_tok_s'])} | {mark('unconstrained', s['ratio'])} | {mark('unconstrained_long', s['ratio_long'])} "
        f"| {rr_text} | {_f(s['meets_target'])} | {_f(s['latency_ms']['p50'])} | {_f(s['latency_ms']['p99'])} | {_f(s['prompt_tokens_mean'])} "
        f"| {_f(s['cached_tokens_mean'])} | {s['short_of_max_tokens']} | {s['off_format']} |"
    )


def markdown(result: dict[str, Any]) -> str:
    cfg = result["config"]
    lines = [f"### Guided decoding, c={cfg['concurrency']}, {cfg['max_tokens']} output tokens, dtype {result.get('dtype') or '?'}", ""]
    run = result.get("run")
    if not run:
        lines.append(f"not measured: {result.get('error')}")
    else:
        lines += [
            "| variant | requests | ok | tok/s | / unconstrained | / unconstrained_long | vs baseline: round min / med / max | meets 0.85 | latency p50 ms | p99 ms | prompt tok | cached tok | short | off-format |",
            "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [_variant_row(v, s) for v, s in run["variants"].items()]
        lines += ["", "Bold: the ratio to the variant's baseline (the same prompt, or one as long), which the 0.85 target applies to."]
        errs = {v: s["error_kinds"] for v, s in run["variants"].items() if s["error_kinds"]}
        if errs:
            lines += ["", f"errors: {json.dumps(errs)[:800]}"]
        if result.get("error"):
            lines += ["", f"error: {result['error'][:500]}"]
    lines += ["", loadavg_line(result)]
    return "\n".join(lines)
