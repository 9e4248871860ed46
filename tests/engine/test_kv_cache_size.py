"""The KV cache sized from memory when no size is given (actors/runners/kv_alloc.py): a model
with a 32k-token window gets all of it (a fixed 1 GiB used to cap the window below the model's),
the cache sized so costs no resident memory until requests reach it, a small share gives a
smaller cache, and an explicit size still wins."""

from __future__ import annotations

from pathlib import Path

import torch

from actors.runners.kv_alloc import lazy_zeros
from actors.runners.runner_config import RunnerConfig
from actors.runners.torch_runner import TorchRunner
from runtime.kv_budget import host_memory
from tests.support.tiny_model import build_tiny_decoder

WINDOW = 32_768


def _runner(model: Path, **options: object) -> TorchRunner:
    return TorchRunner(model, RunnerConfig(device="cpu", dtype="float32", max_num_seqs=128, compile=False, **options))  # type: ignore[arg-type]


def test_a_model_gets_its_whole_window_and_the_cache_costs_nothing_until_used(tmp_path: Path) -> None:
    model = build_tiny_decoder(tmp_path / "m", "llama", max_position_embeddings=WINDOW)
    before = host_memory().in_use
    runner = _runner(model)
    info = runner.load()
    cache_bytes = sum(t.numel() * t.element_size() for t in runner.k_cache + runner.v_cache)
    assert info.num_kv_blocks * info.block_size >= WINDOW and info.max_model_len == WINDOW
    assert cache_bytes > 256 << 20  # sized for the window's many sequences, not 16 blocks
    assert host_memory().in_use - before < cache_bytes // 4  # zeroed by the OS on first touch
    assert runner.k_cache[0].abs().sum().item() == 0.0

    small = _runner(model, memory_utilization=1e-6).load()
    assert small.num_kv_blocks < info.num_kv_blocks  # the 1 GiB floor, below the sequences' cap
    fixed = _runner(model, kv_cache_gib=0.01).load()
    assert fixed.num_kv_blocks == max(16, int(0.01 * (1 << 30)) // (cache_bytes // info.num_kv_blocks))


def test_lazily_zeroed_tensors_are_aligned_zeros_of_the_shape() -> None:
    t = lazy_zeros((3, 1000, 64), torch.bfloat16, torch.device("cpu"))
    assert t.shape == (3, 1000, 64) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert t.data_ptr() % 64 == 0 and not t.any()
    t[1, 5] = 2.0
    assert t.sum().item() == 128.0
