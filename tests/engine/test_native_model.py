"""The native Llama-family path against transformers, on tiny random models of each shape.

Logits of packed steps (fresh prefill chunks, continued chunks over cached keys, decode tokens
side by side) against transformers' own forward of each whole sequence; and greedy output
through the real runtime, eight concurrent staggered requests, token-identical to `generate`.
On the suite's device (tests/support/device.py): on a GPU the decode steps replay CUDA graphs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from actors.runners.native.config import load_hf_config
from actors.runners.native.families import check
from actors.runners.runner_config import RunnerConfig
from actors.runners.torch_runner import TorchRunner
from tests.support.device import on_gpu, suite_device
from tests.support.equivalence import SHAPES, make_prompts, reference, run_engine
from tests.support.tiny_model import build_tiny_decoder


@pytest.fixture(scope="module", params=sorted(SHAPES))
def shaped_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    family, overrides = SHAPES[request.param]
    return build_tiny_decoder(tmp_path_factory.mktemp(request.param), family, **overrides)


def _packed_logits(model_dir: Path, sequences: list[list[int]], splits: list[list[int]]) -> list[torch.Tensor]:
    """Run each sequence through the native runner in the given chunk sizes, all sequences in
    the same steps; every position's logits, per sequence."""
    runner = TorchRunner(model_dir, RunnerConfig(device=suite_device(), dtype="float32", num_kv_blocks=128, block_size=4, num_threads=1, model_impl="native"))
    runner.load()
    assert runner.model is not None and runner.model.impl == ("native+cudagraphs" if on_gpu() else "native")
    tables = [list(range(i * 24, (i + 1) * 24)) for i in range(len(sequences))]
    done = [0] * len(sequences)
    out: list[list[torch.Tensor]] = [[] for _ in sequences]
    for step in range(max(len(s) for s in splits)):
        active = [i for i in range(len(sequences)) if step < len(splits[i]) and splits[i][step] > 0]  # 0: sits this step out
        seqs = [(done[i], splits[i][step]) for i in active]
        step_meta, positions = runner.model.build_step(seqs, [tables[i] for i in active], 4, runner.k_cache, runner.v_cache)
        ids = torch.tensor([t for i in active for t in sequences[i][done[i] : done[i] + splits[i][step]]], device=runner.device)
        with torch.inference_mode():
            logits = runner.model.forward(ids, positions, step_meta, torch.arange(len(ids), device=runner.device), runner.k_cache, runner.v_cache).cpu()
        cursor = 0
        for i in active:
            n = splits[i][step]
            out[i].append(logits[cursor : cursor + n])
            cursor += n
            done[i] += n
    return [torch.cat(parts) for parts in out]


def test_native_logits_match_transformers_forward(shaped_model: Path) -> None:
    assert check(load_hf_config(shaped_model)) is None
    ref = AutoModelForCausalLM.from_pretrained(shaped_model, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    sequences = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in (21, 9, 6, 30)]
    # fresh chunk then continued chunks, a one-token prompt then decodes, several fresh prefills
    # at once, then a fresh prompt beside a continued chunk (the gathered, masked batch)
    splits = [[8, 7, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1], [0, 5, 1], [12, 1, 10, 1, 6]]
    got = _packed_logits(shaped_model, sequences, splits)
    for seq, logits in zip(sequences, got):
        with torch.no_grad():
            expected = ref(torch.tensor([seq])).logits[0]
        torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["qwen2-gqa-biases", "qwen3-qk-norm-tied"])
async def test_native_greedy_matches_generate_under_concurrency(name: str, tmp_path: Path) -> None:
    family, overrides = SHAPES[name]
    model_dir = build_tiny_decoder(tmp_path, family, **overrides)
    prompts = make_prompts(AutoModelForCausalLM.from_pretrained(model_dir).config.vocab_size)
    expected = reference(model_dir, prompts)
    got, stats = await run_engine(model_dir, prompts, num_kv_blocks=40, max_num_batched_tokens=16)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"prompt {i} (len {len(prompts[i])}) diverged"
    assert stats["preemptions"] > 0 and stats["prefix_hits"] > 0 and stats["kv_blocks_used"] == 0


def test_unsupported_shapes_fall_back_with_a_reason(tmp_path: Path) -> None:
    model_dir = build_tiny_decoder(tmp_path, "llama", mlp_bias=True)
    assert check(load_hf_config(model_dir)) == "mlp_bias"
    runner = TorchRunner(model_dir, RunnerConfig(device=suite_device(), dtype="float32", num_kv_blocks=32, block_size=4, num_threads=1))
    assert runner.load().impl == "transformers"
    with pytest.raises(ValueError, match="mlp_bias"):
        TorchRunner(model_dir, RunnerConfig(device=suite_device(), dtype="float32", num_kv_blocks=32, block_size=4, num_threads=1, model_impl="native")).load()


def test_a_sliding_window_is_refused_on_both_paths_past_it(tmp_path: Path) -> None:
    model_dir = build_tiny_decoder(tmp_path, "mistral", sliding_window=16)
    assert check(load_hf_config(model_dir)) == "sliding-window attention" and check(load_hf_config(model_dir), 16) is None
    for impl in ("auto", "transformers"):  # the transformers path's paged attention would attend past the window
        with pytest.raises(ValueError, match="16-token window"):
            TorchRunner(model_dir, RunnerConfig(device=suite_device(), dtype="float32", num_kv_blocks=32, block_size=4, num_threads=1, model_impl=impl)).load()
