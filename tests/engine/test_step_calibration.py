"""The runner's timed start-up steps seed the scheduler's step cost model, so the time budget
holds from the first burst of prompts rather than after the fit has watched real steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.runners import calibration
from actors.runners.runner_config import RunnerConfig
from actors.runners.torch_runner import TorchRunner
from tests.support.device import suite_device


@pytest.mark.parametrize("num_kv_blocks", [64, 6])  # room for every shape; a cache too small for them
def test_warmup_times_each_shape_and_leaves_the_cache_clean(tiny_model_dir: Path, num_kv_blocks: int) -> None:
    # On a GPU the warm-up also captures every batch bucket's CUDA graph before it times the steps.
    runner = TorchRunner(tiny_model_dir, RunnerConfig(device=suite_device(), dtype="float32", num_kv_blocks=num_kv_blocks, block_size=4, num_threads=1))
    runner.load()
    samples = runner.warmup()
    assert [(rows, tokens > 0) for rows, tokens, _ in samples] == [(1, False), (calibration.ROWS, False), (0, True), (1, True), (calibration.ROWS, True)]
    assert all(seconds > 0 for _, _, seconds in samples)
    assert all(not cache.any() for cache in (*runner.k_cache, *runner.v_cache))  # nothing left behind
    runner.close()


def test_batch_invariant_engines_schedule_by_the_token_budget_alone() -> None:
    # The time allowance splits prompts by measured step times, and a chunk boundary changes
    # a prompt's rounding: batch invariance cannot have it.
    from actors.engine import Engine
    from runtime.config import RuntimeConfig
    from runtime.protocol import ModelInfo

    info = ModelInfo(max_model_len=512, vocab_size=320, device="cpu", dtype="float32", num_kv_blocks=64, block_size=4, fingerprint="fp")
    for invariant, stretch, burst in ((False, 1.7, 8192), (True, None, 0)):
        runtime = Engine(RuntimeConfig(batch_invariant=invariant), runner=None, tokenizer=None, served_name="m", eos_token_ids=frozenset())  # type: ignore[arg-type]
        runtime.max_model_len = 512
        config = runtime.make_core(info).config
        assert (config.step_stretch, config.burst_tokens) == (stretch, burst)  # batch invariance: neither


def test_a_model_that_reads_images_defaults_to_a_tighter_stretch() -> None:
    # An image prompt puts a chunk in nearly every step while images come in (runtime/config.py
    # IMAGE_STEP_STRETCH says what was measured); a stretch given by name is kept.
    from actors.engine import Engine
    from runtime.config import RuntimeConfig
    from runtime.protocol import ModelInfo

    info = ModelInfo(max_model_len=512, vocab_size=320, device="cpu", dtype="float32", num_kv_blocks=64, block_size=4, fingerprint="fp")
    stretches = {}
    for given, images, limit in (("auto", None, 8), ("auto", object(), 8), ("auto", object(), 0), (1.7, object(), 8), (None, object(), 8)):
        config = RuntimeConfig(step_stretch=given, limit_images_per_prompt=limit)
        runtime = Engine(config, runner=None, tokenizer=None, served_name="m", eos_token_ids=frozenset(), images=images)  # type: ignore[arg-type]
        runtime.max_model_len = 512
        stretches[(given, images is not None, limit)] = runtime.make_core(info).config.step_stretch
    # A vision model served with no images a prompt (--limit-images-per-prompt 0) reads text only.
    assert stretches == {("auto", False, 8): 1.7, ("auto", True, 8): 1.5, ("auto", True, 0): 1.7, (1.7, True, 8): 1.7, (None, True, 8): None}


def test_the_runners_prompt_chunks_reach_the_scheduler_unless_the_flag_says() -> None:
    from actors.engine import Engine
    from runtime.config import RuntimeConfig
    from runtime.protocol import ModelInfo

    for asked, flag, expected in ((1, None, 1), (None, None, None), (1, 4, 4)):
        info = ModelInfo(max_model_len=512, vocab_size=320, device="cpu", dtype="float32", num_kv_blocks=64, block_size=4, fingerprint="fp", prompt_chunks=asked)
        runtime = Engine(RuntimeConfig(max_prompt_chunks=flag), runner=None, tokenizer=None, served_name="m", eos_token_ids=frozenset())  # type: ignore[arg-type]
        runtime.max_model_len = 512
        assert runtime.make_core(info).config.max_prompt_chunks == expected
