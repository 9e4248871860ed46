"""The benchmark drivers' ratios (ops/bench/run/ratios.py, ops/harness/baselines.py) and the
model their servers serve (ops/harness/servers.py): pure functions, so a wrong baseline cannot
slip into a README table unnoticed."""

from __future__ import annotations

from ops.bench.run.ratios import compute_ratios
from ops.harness.baselines import workload_tok_s


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
    ratios = compute_ratios(result)["switchyard"]
    native_workload = 2048 / (3.0 + 2048 / 400 * 63 / 64)
    assert ratios["tok_s_over_bare_native[native]_per_level"] == {"32": 0.5}
    assert ratios["tok_s_over_bare_native_workload[native]_per_level"] == {"32": round(200 / round(native_workload, 2), 3)}
    assert ratios["tok_s_c32_over_bare_bf16_b32"] == 1.25
    eager_workload = round(2048 / (4.0 + 2048 / 160 * 63 / 64), 2)
    assert ratios["tok_s_c32_over_bare_bf16_workload_b32"] == round(200 / eager_workload, 3)


def test_overhead_reads_whole_step_lines_only_and_sums_them(tmp_path) -> None:
    import json

    from ops.bench.overhead import step_lines, step_summary

    def line(rows: int, tokens: int, ms: float = 10.0) -> bytes:
        return json.dumps({"event": "step", "decode_rows": rows, "prompt_tokens": tokens, "ms": ms}).encode() + b"\n"

    log = tmp_path / "server.log"
    log.write_bytes(line(0, 128) + b'{"event": "http_request"}\n' + line(1, 90) + line(2, 90)[:20])  # the last one half written
    steps, offset = step_lines(log, 0)
    assert [s["prompt_tokens"] for s in steps] == [128, 90]
    log.write_bytes(log.read_bytes() + line(2, 90)[20:] + line(3, 0) + line(0, 64) + line(1, 0))
    more, _ = step_lines(log, offset)
    assert [(s["decode_rows"], s["prompt_tokens"]) for s in more] == [(2, 90), (3, 0), (0, 64), (1, 0)]
    summary = step_summary(steps + more, level_wall_s=0.1)
    assert summary == {"steps": 6, "prompt_tokens": 372, "decode_rows": 7, "mean_decode_rows": 1.8, "in_flight_share": 0.6}


def test_a_given_model_is_what_the_servers_serve_and_what_requests_name(tmp_path) -> None:
    # ops.bench.overhead once timed the bare step on --model while its servers served the
    # embedded default: both drivers now take the server's --model and the requests' model
    # field from here.
    from ops.harness.servers import DEFAULT_SERVED_NAME, model_server_args

    assert model_server_args(None) == ([], DEFAULT_SERVED_NAME)
    model = tmp_path / "tiny-llama"
    assert model_server_args(str(model)) == (["--model", str(model.resolve())], "tiny-llama")
    assert model_server_args(str(model), "custom") == (["--model", str(model.resolve())], "custom")
