"""The one-row decode graph (actors/runners/native/decode_graph.py): compiled once in the
background after warm-up, then a single stream's decode steps run it, never recompile as the context grows across
blocks, write the cache exactly as the eager step does and give the eager step's logits.
On the CPU whatever SWITCHYARD_TEST_DEVICE says: on CUDA the decode steps are CUDA graphs instead."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from actors.runners.torch_runner import TorchRunner

BLOCK = 4
TABLE = list(range(8))


def _decode(runner: TorchRunner, prompt: list[int], steps: int) -> tuple[list[torch.Tensor], list[int]]:
    """Prefill `prompt`, then greedy decode steps of the one sequence; each decode step's logits."""
    assert runner.model is not None
    logits, tokens = [], []
    with torch.inference_mode():
        ids, start = torch.tensor(prompt), 0
        for _ in range(steps + 1):
            step, positions = runner.model.build_step([(start, ids.shape[0])], [TABLE], BLOCK, runner.k_cache, runner.v_cache)
            out = runner.model.forward(ids, positions, step, torch.tensor([ids.shape[0] - 1]), runner.k_cache, runner.v_cache).float()
            if start:
                logits.append(out)
            start += ids.shape[0]
            ids = out.argmax(-1)
            tokens.append(int(ids))
    return logits, tokens


def _runners(model_dir: Path, **settings: object) -> tuple[TorchRunner, TorchRunner]:
    kwargs = dict(device="cpu", num_kv_blocks=32, block_size=BLOCK, num_threads=1, **settings)
    eager = TorchRunner(model_dir, **kwargs)
    eager.load()
    compiled = TorchRunner(model_dir, compile=True, **kwargs)
    compiled.load()
    compiled.warmup()
    assert compiled.model.decode_graph.wait_ready(300)  # compiled in the background, then swapped in
    return eager, compiled


@pytest.mark.parametrize(("dtype", "quantization", "tolerance"), [("float32", None, 1e-4), ("bfloat16", "int4", 0.05)])
def test_one_row_decode_graph_matches_eager_and_never_recompiles(tiny_model_dir: Path, dtype: str, quantization: str | None, tolerance: float) -> None:
    eager, compiled = _runners(tiny_model_dir, dtype=dtype, quantization=quantization)
    graph = compiled.model.decode_graph
    assert graph is not None and graph.ready
    runs = []
    inner = graph.compiled
    graph.compiled = lambda *args: runs.append(1) or inner(*args)
    torch._dynamo.config.error_on_recompile = True
    try:
        got_logits, got_tokens = _decode(compiled, [5, 6, 7, 8, 9, 10], 12)  # context 7 → 18: crosses blocks 2 → 5
    finally:
        torch._dynamo.config.error_on_recompile = False
    want_logits, want_tokens = _decode(eager, [5, 6, 7, 8, 9, 10], 12)
    assert len(runs) == 12  # every decode step ran the graph, the prefill did not
    if dtype == "float32":
        assert got_tokens == want_tokens
    for got, want in zip(got_logits, want_logits, strict=True):
        assert (got - want).norm() / want.norm() < tolerance
    for got, want in zip(compiled.k_cache + compiled.v_cache, eager.k_cache + eager.v_cache, strict=True):
        got = got[:, : want.shape[1]]  # past them: the block the background compile decoded in
        torch.testing.assert_close(got.float(), want.float(), rtol=tolerance, atol=tolerance)  # the graph wrote slots 6..17 in place


def _verify_steps(runner: TorchRunner, prompt: list[int], feeds: list[list[int]]) -> list[torch.Tensor]:
    """Prefill `prompt`, then steps of one sequence fed each of `feeds` (a token and a draft):
    every fed token's logits."""
    assert runner.model is not None
    out = []
    with torch.inference_mode():
        start = 0
        for ids in [prompt, *feeds]:
            step, positions = runner.model.build_step([(start, len(ids))], [TABLE], BLOCK, runner.k_cache, runner.v_cache)
            logits = runner.model.forward(torch.tensor(ids), positions, step, torch.arange(len(ids)), runner.k_cache, runner.v_cache).float()
            if start:
                out.append(logits)
            start += len(ids)
    return out


@pytest.mark.parametrize(("dtype", "quantization", "tolerance"), [("float32", None, 1e-4), ("bfloat16", "int4", 0.05)])
def test_few_token_graph_runs_every_draft_length_and_matches_eager(tiny_model_dir: Path, dtype: str, quantization: str | None, tolerance: float) -> None:
    """A verify step (one sequence fed its token and a draft) runs the few-token graph, compiled
    once for every token count and context length, with the eager step's logits and cache."""
    eager, compiled = _runners(tiny_model_dir, dtype=dtype, quantization=quantization)
    graph = compiled.model.decode_graph
    assert graph is not None and graph.wait_few_ready(300)
    runs = []
    inner = graph.compiled_few
    graph.compiled_few = lambda *args: runs.append(1) or inner(*args)
    feeds = [[11, 12], [13, 14, 15, 16, 17], [18, 19, 20], [21, 22, 23, 24]]  # context 6 → 20: crosses blocks
    torch._dynamo.config.error_on_recompile = True
    try:
        got = _verify_steps(compiled, [5, 6, 7, 8, 9, 10], feeds)
    finally:
        torch._dynamo.config.error_on_recompile = False
    want = _verify_steps(eager, [5, 6, 7, 8, 9, 10], feeds)
    assert len(runs) == len(feeds)  # every verify step ran the graph, the prefill did not
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and (g - w).norm() / w.norm() < tolerance
    for g, w in zip(compiled.k_cache + compiled.v_cache, eager.k_cache + eager.v_cache, strict=True):
        torch.testing.assert_close(g[:, : w.shape[1]].float(), w.float(), rtol=tolerance, atol=tolerance)
