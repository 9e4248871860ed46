"""The time-based step budget: `StepCostModel` (actors/step_cost.py) and the scheduler core using it.

The core is driven on a simulated clock: each step "takes" what a linear cost function says a
step of its size takes, with this EPYC's rough figures (50 ms a step, 1.5 ms a decode row, 1 ms
a prompt token), so the gaps between a stream's tokens are exact and the test times nothing real.
The workload is the benchmark's: closed loop at concurrency 32, 128-token prompts, 64 tokens out.
"""

from __future__ import annotations

import random
import statistics

import pytest

from actors.step_cost import MIN_STEPS, OUTLIER_RUN, PromptTokens, StepCostModel
from api.process.flags import parse_args
from runtime.config import RuntimeConfig
from tests.support.sched_driver import Driver, assert_drained, make_core, prompt_of

BASE, PER_ROW, PER_TOKEN = 0.050, 0.0015, 0.001
CALIBRATION_SHAPES = [(1, 0), (32, 0), (0, 256), (1, 256), (32, 128)]  # the runner's timed start-up steps (actors/runners/calibration.py)


def cost(decode_rows: int, prefill_tokens: int) -> float:
    return BASE + PER_ROW * decode_rows + PER_TOKEN * prefill_tokens


def test_the_fit_recovers_a_linear_cost_and_sizes_the_allowance():
    model = StepCostModel()
    for i in range(40):
        rows, tokens = (i * 7) % 33, (i * 37) % 300
        model.observe(rows, tokens, cost(rows, tokens))
    assert model.predict(32, 64) == pytest.approx(cost(32, 64), rel=1e-2)
    # A step of 32 decodes takes 98 ms alone; at stretch 2 it may add 98 ms of prompt: 98 tokens.
    assert model.prefill_allowance(32, 2.0) == pytest.approx(98, abs=1)
    assert model.prefill_allowance(32, 1.5) == pytest.approx(49, abs=1)
    # What the scheduler's debug step line prints of the fit, in milliseconds.
    fit = model.coefficients_ms()
    assert fit is not None
    assert fit["base"] == pytest.approx(BASE * 1e3, abs=0.5) and fit["per_token"] == pytest.approx(PER_TOKEN * 1e3, abs=0.01)
    assert fit["per_row"] == pytest.approx(PER_ROW * 1e3, abs=0.01) and fit["prompt_step"] == 0.0


def test_no_answer_until_both_kinds_of_step_were_seen():
    model = StepCostModel()
    for _ in range(3 * MIN_STEPS):
        model.observe(16, 0, cost(16, 0))  # decodes only: a prompt token's cost is unknown
    assert model.prefill_allowance(16, 2.0) is None
    for _ in range(MIN_STEPS):
        model.observe(0, 128, cost(0, 128))
    assert model.prefill_allowance(16, 2.0) is not None


def test_prompt_tokens_that_cost_next_to_nothing_get_the_whole_budget():
    model = StepCostModel()  # a GPU, say: the step takes its fixed time whatever the chunk
    for i in range(2 * MIN_STEPS):
        model.observe(8, 64 * (i % 2 + 1), 0.05)
        model.observe(8, 0, 0.05)
    allowance = model.prefill_allowance(8, 2.0)
    assert allowance is None or allowance > 512


def test_the_runners_start_up_steps_make_the_fit_trusted_from_the_first_step():
    seeded = make_core(step_stretch=2.0, step_samples=tuple((r, t, cost(r, t)) for r, t in CALIBRATION_SHAPES))
    assert seeded.step_cost.prefill_allowance(32, 2.0) == pytest.approx(98, abs=2)
    assert make_core(step_stretch=2.0).step_cost.prefill_allowance(32, 2.0) is None


def test_a_stalled_step_does_not_skew_the_fit_but_a_slower_machine_is_learnt():
    model = StepCostModel(tuple((r, t, cost(r, t)) for r, t in CALIBRATION_SHAPES))
    before = model.prefill_allowance(32, 2.0)
    model.observe(32, 0, 3.0)  # another process had the cores for 3 s
    assert model.prefill_allowance(32, 2.0) == before
    shapes = [(1, 0), (32, 0), (0, 256), (8, 128), (32, 100)]
    for i in range(OUTLIER_RUN + 4 * MIN_STEPS):  # everything 5x slower from now on
        rows, tokens = shapes[i % len(shapes)]
        model.observe(rows, tokens, 5 * cost(rows, tokens))
    assert model.predict(32, 64) == pytest.approx(5 * cost(32, 64), rel=0.05)


def test_prompt_tokens_never_hold_back_a_decode():
    prompt = PromptTokens(10)
    assert prompt.take(1) == 1 and prompt.left == 10
    assert prompt.take(8) == 8 and prompt.take(8) == 2 and prompt.take(8) == 0
    assert prompt.take(1) == 1


def simulate(
    step_stretch: float | None, concurrency: int = 32, total: int = 96, step_cost=cost, step_samples: tuple = (), max_prompt_chunks: int | None = None, chunk_cost=None,
    burst_tokens: int = 0, first_alone: bool = False, rows: list[int] | None = None,
) -> tuple[list[float], float, int]:  # fmt: skip
    """Closed loop on the simulated clock: (gaps between a stream's tokens, seconds, tokens out).
    `chunk_cost(rows, tokens, chunks)`, when given, times each step instead of `step_cost`.
    `first_alone`: the first request's step is planned before the others arrive, as a real
    client's first connection beats the rest. `rows`, when given, collects each step's decode rows."""
    core = make_core(
        num_blocks=1024, block_size=16, max_num_seqs=128, max_num_batched_tokens=512, step_stretch=step_stretch, step_samples=step_samples, max_prompt_chunks=max_prompt_chunks,
        burst_tokens=burst_tokens,
    )  # fmt: skip
    driver = Driver(core)
    now, started = 0.0, 0
    last_token_at: dict[str, float] = {}
    gaps: list[float] = []
    planned_alone = None
    while started < concurrency:
        driver.add(f"r{started}", prompt_of(128, start=10 + 200 * started), max_tokens=64, ignore_eos=True)
        started += 1
        if first_alone and started == 1:
            planned_alone = driver.schedule()
    while core.has_work:
        plan, planned_alone = planned_alone or driver.schedule(), None
        assert plan is not None
        if rows is not None:
            rows.append(plan.num_decode_rows)
        chunks = sum(1 for item in plan.seqs if len(item.token_ids) > 1)
        step_s = chunk_cost(plan.num_decode_rows, plan.num_prefill_tokens, chunks) if chunk_cost else step_cost(plan.num_decode_rows, plan.num_prefill_tokens)
        deltas = driver.update(plan, driver.result(plan), now, now + step_s)
        now += step_s
        for delta in deltas:
            if delta.request_id in last_token_at:
                gaps.append(now - last_token_at[delta.request_id])
            last_token_at[delta.request_id] = now
            if delta.finish_reason is not None and started < total:  # the closed loop's next request
                driver.add(f"r{started}", prompt_of(128, start=10 + 200 * started), max_tokens=64, ignore_eos=True)
                started += 1
    assert_drained(core)
    assert len(driver.finished) == total
    return gaps, now, sum(len(out) for out in driver.outputs.values())


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def test_a_time_budget_keeps_the_p99_gap_within_the_stretch_at_c32():
    fixed_gaps, fixed_s, fixed_tokens = simulate(step_stretch=None)
    timed_gaps, timed_s, timed_tokens = simulate(step_stretch=2.0)
    fixed_ratio = percentile(fixed_gaps, 99) / percentile(fixed_gaps, 50)
    timed_ratio = percentile(timed_gaps, 99) / percentile(timed_gaps, 50)
    throughput = (timed_tokens / timed_s) / (fixed_tokens / fixed_s)
    print(f"p99/p50 gap: token budget {fixed_ratio:.2f}, time budget {timed_ratio:.2f}; tok/s time/token {throughput:.3f}")
    assert fixed_ratio > 3.0  # the stall this budget is for: a step carrying a 512-token chunk
    assert timed_ratio <= 2.0
    # The same prompt work in smaller chunks, each step paying its fixed cost: 0.947 here.
    assert throughput >= 0.9


def test_the_flag_and_key_reach_the_runtime_config(tmp_path, capsys):
    default = parse_args(["serve"]).config
    assert default.step_stretch == "auto" and (default.stretch_for(reads_images=False), default.stretch_for(reads_images=True)) == (1.7, 1.5)
    assert parse_args(["serve", "--step-stretch", "1.5"]).config.step_stretch == 1.5
    assert parse_args(["serve", "--step-stretch", "off"]).config.step_stretch is None
    assert parse_args(["serve", "--step-stretch", "auto"]).config.step_stretch == "auto"
    _assert_flag_and_key(tmp_path, capsys, "--step-stretch", "0.5", "step_stretch", "1.4", 1.4, "1")
    _assert_flag_and_key(tmp_path, capsys, "--step-stretch", "inf", "step_stretch", '"off"', None, '"fast"')
    _assert_flag_and_key(tmp_path, capsys, "--step-stretch", "nan", "step_stretch", "2", 2.0, "nan")  # inf or nan would overflow the allowance
    _assert_flag_and_key(tmp_path, capsys, "--step-stretch", "1", "step_stretch", '"auto"', "auto", "true")


def _assert_flag_and_key(tmp_path, capsys, flag: str, refused_flag: str, key: str, toml_value: str, expected: object, refused_toml: str) -> None:
    """`flag` refuses `refused_flag` at the command line (exit 2, naming it); the TOML `key`
    reaches the runtime config as `expected` and refuses `refused_toml`, naming the key."""
    from api.process.config_file import model_configs, read_config_file

    with pytest.raises(SystemExit) as exit_info:
        parse_args(["serve", flag, refused_flag])
    assert exit_info.value.code == 2 and flag in capsys.readouterr().err
    config = tmp_path / "switchyard.toml"
    config.write_text(f'[[models]]\nname = "a"\n{key} = {toml_value}\n')
    (served,) = model_configs(RuntimeConfig(), read_config_file(str(config)), with_embeddings=False)
    assert getattr(served, key) == expected
    config.write_text(f'[[models]]\nname = "a"\n{key} = {refused_toml}\n')
    with pytest.raises(SystemExit, match=key):
        read_config_file(str(config))


def test_the_prompt_chunks_flag_and_key_reach_the_runtime_config(tmp_path, capsys):
    assert parse_args(["serve"]).config.max_prompt_chunks is None  # auto: the runner's
    assert parse_args(["serve", "--max-prompt-chunks", "2"]).config.max_prompt_chunks == 2
    assert parse_args(["serve", "--max-prompt-chunks", "auto"]).config.max_prompt_chunks is None
    _assert_flag_and_key(tmp_path, capsys, "--max-prompt-chunks", "0", "max_prompt_chunks", "3", 3, '"auto"')


def test_the_burst_flag_and_key_reach_the_runtime_config(tmp_path, capsys):
    assert parse_args(["serve"]).config.burst_tokens == 8192
    assert parse_args(["serve", "--burst-tokens", "0"]).config.burst_tokens == 0
    _assert_flag_and_key(tmp_path, capsys, "--burst-tokens", "-1", "burst_tokens", "0", 0, "1.5")


def _jittered_cost(rng: random.Random):
    def jittered(rows: int, tokens: int) -> float:
        return cost(rows, tokens) * rng.uniform(0.85, 1.15)

    return jittered


def test_the_default_stretch_leaves_room_for_steps_that_scatter_around_the_fit():
    # Real steps scatter: on the EPYC of stop 18, mixed steps of 24+ decodes ran 0.99x the fit
    # at the median and 1.14x at p90, and at stretch 2 streams' p99 gap came out over 2x their
    # p50 in 7 of 8 rounds (ops.bench.overhead). Here every step, the start-up calibration's too, takes
    # its linear cost times a seeded jitter of up to +-15%. At stretch 2 three of these five
    # seeds give 2.02-2.18 (and four of ten over 2); the default must keep all within 2.
    for seed in range(5):
        jittered = _jittered_cost(random.Random(seed))
        seed_steps = tuple((r, t, jittered(r, t)) for r, t in CALIBRATION_SHAPES)
        gaps, _, _ = simulate(step_stretch=RuntimeConfig().stretch_for(reads_images=False), step_cost=jittered, step_samples=seed_steps)
        ratio = percentile(gaps, 99) / percentile(gaps, 50)
        print(f"seed {seed}: p99/p50 gap at the default stretch with steps jittered +-15%: {ratio:.2f}")
        assert ratio <= 2.0, seed


def gpu_cost(decode_rows: int, prefill_tokens: int) -> float:
    """An H100 serving the embedded model's shape (ops/results/gpu-check-first-run-2026-11-26-h100.json):
    a decode-only step replays a CUDA graph; a step with prompt tokens runs eager and
    pays ~20 ms of kernel launches, however few tokens it carries."""
    step = 0.0037 + 0.00005 * decode_rows
    return step + (0.020 + 0.00002 * prefill_tokens if prefill_tokens else 0.0)


def test_where_any_prompt_chunk_costs_a_fixed_time_a_prompt_goes_in_one_step():
    samples = tuple((r, t, gpu_cost(r, t)) for r, t in CALIBRATION_SHAPES)
    model = StepCostModel(samples)
    assert model.predict(32, 128) == pytest.approx(gpu_cost(32, 128), rel=1e-2)
    assert model.predict(8, 0) == pytest.approx(gpu_cost(8, 0), rel=1e-2)
    # 32 decodes take 5.3 ms: no chunk keeps a 20 ms eager step within 1.7x that, so the step
    # carries what its fixed cost is worth (1,000 tokens), not a block.
    assert model.prefill_allowance(32, 1.7) >= 512
    timed_gaps, timed_s, timed_tokens = simulate(step_stretch=1.7, step_cost=gpu_cost, step_samples=samples)
    fixed_gaps, fixed_s, fixed_tokens = simulate(step_stretch=None, step_cost=gpu_cost)
    throughput = (timed_tokens / timed_s) / (fixed_tokens / fixed_s)
    print(f"tok/s time budget / token budget {throughput:.3f}; p99 gap {percentile(timed_gaps, 99) * 1e3:.1f} ms vs {percentile(fixed_gaps, 99) * 1e3:.1f}")
    assert throughput >= 0.97  # fitted per token, the fixed cost chunked prompts by blocks: 0.20


def test_a_fixed_prompt_cost_under_a_decode_steps_is_carried_per_token():
    def cpu_cost(rows: int, tokens: int) -> float:  # a few ms of Python to build a chunk
        return cost(rows, tokens) + (0.004 if tokens else 0.0)

    model = StepCostModel(tuple((r, t, cpu_cost(r, t)) for r, t in CALIBRATION_SHAPES))
    # A draft's 4 verify rows cost 4 tokens' time, not a prompt step's fixed cost on top (which
    # made the tiny model's drafts look not worth it in tests/engine/test_spec_decoding_draft.py).
    assert model.predict(32, 4) - model.predict(32, 0) == pytest.approx(4 * PER_TOKEN, rel=0.1)
    assert model.prefill_allowance(32, 2.0) == pytest.approx(98, abs=2)


def test_one_prompt_chunk_a_step_while_requests_stream_where_the_runner_asks_for_it():
    core = make_core(max_num_batched_tokens=512, num_blocks=256, max_prompt_chunks=1)
    driver = Driver(core)
    driver.add("a", prompt_of(8), max_tokens=50, ignore_eos=True)
    driver.add("b", prompt_of(8, start=100), max_tokens=50, ignore_eos=True)
    first = driver.schedule()
    assert [len(item.token_ids) for item in first.seqs] == [8, 8]  # nobody streams yet: any number of chunks
    driver.update(first, driver.result(first))
    driver.add("c", prompt_of(40, start=200), max_tokens=4, ignore_eos=True)
    driver.add("d", prompt_of(40, start=300), max_tokens=4, ignore_eos=True)
    plan = driver.schedule()
    assert sorted(len(item.token_ids) for item in plan.seqs) == [1, 1, 40]  # "a" and "b" stream: c's chunk alone, d waits
    driver.update(plan, driver.result(plan))
    plan = driver.schedule()
    assert sorted(len(item.token_ids) for item in plan.seqs) == [1, 1, 1, 40]
    unlimited = make_core(max_num_batched_tokens=512, num_blocks=256)
    driver = Driver(unlimited)
    for name, start in (("a", 0), ("b", 100)):
        driver.add(name, prompt_of(8, start=start), max_tokens=50, ignore_eos=True)
    driver.update(plan := driver.schedule(), driver.result(plan))
    driver.add("c", prompt_of(40, start=200), max_tokens=4, ignore_eos=True)
    driver.add("d", prompt_of(40, start=300), max_tokens=4, ignore_eos=True)
    assert sorted(len(item.token_ids) for item in driver.schedule().seqs) == [1, 1, 40, 40]


def test_where_two_chunks_run_eager_beside_compiled_one_chunk_steps_one_a_step_is_faster_and_smoother():
    # A CPU serving compiled graphs (ops/results/step-ab-two-chunks-vs-one-2026-11-27-xeon-amx.json):
    # a step of decodes beside one prompt chunk runs compiled; beside two, eager: 1.3-1.5x the time there.
    def compiled_cost(rows: int, tokens: int, chunks: int) -> float:
        return cost(rows, tokens) * (1.5 if chunks >= 2 else 1.0)

    samples = tuple((r, t, compiled_cost(r, t, 1 if t else 0)) for r, t in CALIBRATION_SHAPES)
    runs = {limit: simulate(step_stretch=1.7, step_samples=samples, max_prompt_chunks=limit, chunk_cost=compiled_cost) for limit in (None, 1)}
    ratio = {limit: percentile(gaps, 99) / percentile(gaps, 50) for limit, (gaps, _, _) in runs.items()}
    tok_s = {limit: tokens / seconds for limit, (_, seconds, tokens) in runs.items()}
    print(f"p99/p50 gap: any chunks {ratio[None]:.2f}, one {ratio[1]:.2f}; tok/s one / any {tok_s[1] / tok_s[None]:.3f}")
    assert ratio[1] <= 1.8 < ratio[None]
    assert tok_s[1] > tok_s[None]


def test_a_burst_of_arrivals_starts_in_one_step_and_the_batch_stays_whole():
    # The c=32 benchmark's start (ops.bench.overhead): one request arrives first and starts
    # alone; 31 arrive while it streams. Started one a step, they finish one a step too, and
    # every later round of the closed loop runs part-full steps; started in one step, the 32
    # stream in step with each other and their successors come in bursts of their own.
    samples = tuple((r, t, cost(r, t)) for r, t in CALIBRATION_SHAPES)
    runs, rows = {}, {}
    for burst in (0, 8192):
        rows[burst] = []
        runs[burst] = simulate(step_stretch=1.7, step_samples=samples, burst_tokens=burst, first_alone=True, rows=rows[burst])
    ratio = {b: percentile(gaps, 99) / percentile(gaps, 50) for b, (gaps, _, _) in runs.items()}
    tok_s = {b: tokens / seconds for b, (_, seconds, tokens) in runs.items()}
    mean_rows = {b: statistics.mean(r) for b, r in rows.items()}
    print(f"tok/s burst / one a step {tok_s[8192] / tok_s[0]:.3f}; mean decode rows {mean_rows[0]:.1f} -> {mean_rows[8192]:.1f}; p99/p50 gap {ratio[0]:.2f} -> {ratio[8192]:.2f}")
    assert tok_s[8192] > 1.05 * tok_s[0]  # with a linear cost: fewer steps for the same rows (the real gain is larger, docs/performance.md "Bursts")
    assert mean_rows[8192] > 28 > mean_rows[0]
    assert ratio[8192] <= 2.0


def test_a_burst_needs_prompts_waiting_four_to_one_against_the_streams():
    def first_step_with(waiting: int) -> tuple[list[int], int]:
        """Two streams, then `waiting` 40-token prompts: the next step's chunks, and how many still wait."""
        core = make_core(max_num_batched_tokens=32, max_num_seqs=16, num_blocks=512, burst_tokens=1024, step_stretch=1.7, step_samples=tuple((r, t, cost(r, t)) for r, t in CALIBRATION_SHAPES))
        driver = Driver(core)
        for i in range(2):
            driver.add(f"s{i}", prompt_of(8, start=10 + 100 * i), max_tokens=50, ignore_eos=True)
        driver.update(plan := driver.schedule(), driver.result(plan))
        for i in range(waiting):
            driver.add(f"w{i}", prompt_of(40, start=1000 + 100 * i), max_tokens=4, ignore_eos=True)
        plan = driver.schedule()
        return sorted(len(item.token_ids) for item in plan.seqs if len(item.token_ids) > 1), len(core.waiting)

    chunks, left = first_step_with(7)  # 7 beside 2 streams: the time budget holds
    assert sum(chunks) < 100 and left > 0
    chunks, left = first_step_with(8)  # 8 beside 2: all start, each chunk within max_num_batched_tokens
    assert chunks == [32] * 8 and left == 0
