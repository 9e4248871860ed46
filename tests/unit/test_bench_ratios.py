"""The benchmark driver's ratios (ops/bench/run.py, native_sections.py): pure arithmetic on a
results dict, so a wrong baseline cannot slip into a README table unnoticed."""

from __future__ import annotations

from ops.bench import run
from ops.bench.native_sections import workload_tok_s


def test_workload_adds_the_prefill_to_all_but_one_decode_step() -> None:
    # 4 rows x 64 tokens: 1 s of prefill, 64 decode steps at 0.1 s each (decode_tok_s 40);
    # the first token comes from the prefill, so 63 decode steps: 256 / (1 + 6.3).
    assert workload_tok_s({"prefill_ms": 1000.0, "decode_tok_s": 40.0}, 4, 64) == round(256 / 7.3, 2)
    assert workload_tok_s({"prefill_ms": None, "decode_tok_s": 40.0}, 4, 64) is None
    assert workload_tok_s({"prefill_ms": 1000.0, "decode_tok_s": 40.0}, 4, 0) is None


def test_server_ratios_over_decode_only_and_workload_baselines() -> None:
    bare_entry = {"prefill_ms": 3000.0, "decode_tok_s": 400.0}  # B=32, 64 steps
    result = {
        "bare_forward": {"decode_steps": 64, "dtypes": {"bfloat16": {"batches": {"32": {"prefill_ms": 4000.0, "decode_tok_s": 160.0}}}}},
        "bare_native_baseline": "native",
        "bare_native": {"decode_steps": 64, "variants": {"native": {"batches": {"32": bare_entry}}}},
        "switchyard": {"dtype": "bfloat16", "sweep": {"levels": [{"concurrency": 32, "output_tok_s": 200.0, "ttft_ms": {"p50": 1.0}}]}},
    }
    ratios = run.compute_ratios(result)["switchyard"]
    native_workload = 2048 / (3.0 + 2048 / 400 * 63 / 64)
    assert ratios["tok_s_over_bare_native[native]_per_level"] == {"32": 0.5}
    assert ratios["tok_s_over_bare_native_workload[native]_per_level"] == {"32": round(200 / round(native_workload, 2), 3)}
    assert ratios["tok_s_c32_over_bare_bf16_b32"] == 1.25
    eager_workload = round(2048 / (4.0 + 2048 / 160 * 63 / 64), 2)
    assert ratios["tok_s_c32_over_bare_bf16_workload_b32"] == round(200 / eager_workload, 3)


def test_overhead_keeps_the_levels_steps_and_sums_them() -> None:
    from ops.bench.overhead import _after_warmup, step_summary

    def step(rows: int, tokens: int, ms: float = 10.0) -> dict:
        return {"decode_rows": rows, "prompt_tokens": tokens, "ms": ms}

    warmup = [step(0, 128), step(1, 40), step(2, 0), step(2, 0), step(1, 0)]
    level = [step(0, 128), step(1, 90), step(2, 90), step(3, 0), step(0, 64), step(1, 0)]
    assert _after_warmup(warmup + level) == level  # the level's later prompt-only step is not its start
    summary = step_summary(level, level_wall_s=0.1)
    assert summary == {"steps": 6, "prompt_tokens": 372, "decode_rows": 7, "mean_decode_rows": 1.8, "busy_share": 0.6}
