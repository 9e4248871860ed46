"""The decode graphs (actors/runners/native/decode_graph.py): compiled once in the background
after warm-up, then the steps they take (a single stream's decode, decodes of several rows by
width class, one sequence's few tokens) run them, never recompile as the context grows across
blocks, write the cache exactly as the eager step does and give the eager step's logits.
On the CPU whatever SWITCHYARD_TEST_DEVICE says: on CUDA the decode steps are CUDA graphs instead."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from actors.runners.runner_config import RunnerConfig
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


@dataclass
class Pair:
    eager: TorchRunner
    compiled: TorchRunner
    dtype: str
    tolerance: float


# (dtype, quantization, logits tolerance, the compiled runner's max_num_seqs). The int4 pair
# holds one sequence a step, so it compiles the one-row and few-token graphs alone: the graphs
# of several rows switch classes where the float32 pair's do (the attention's float32 path
# and the int4 kernel both switch past 4 rows), and each graph costs CI ~10 s to compile.
PAIRS = {"float32": ("float32", None, 1e-4, 256), "bfloat16-int4": ("bfloat16", "int4", 0.05, 1)}


@pytest.fixture(scope="module", params=list(PAIRS))
def pair(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Iterator[Pair]:
    """An eager runner and a compiled one of the same settings, shared by this module's tests
    (each graph compiles once). Every graph is compiled before a test runs: a test turns
    recompiles into errors, and the few-token graph's second token count is one."""
    dtype, quantization, tolerance, max_num_seqs = PAIRS[request.param]
    kwargs = dict(device="cpu", num_kv_blocks=32, block_size=BLOCK, num_threads=1, dtype=dtype, quantization=quantization)
    eager = TorchRunner(tiny_model_dir, RunnerConfig(**kwargs))
    eager.load()
    compiled = TorchRunner(tiny_model_dir, RunnerConfig(compile=True, max_num_seqs=max_num_seqs, **kwargs))
    compiled.load()
    compiled.warmup()
    graph = compiled.model.decode_graph
    assert graph.wait_ready(300) and graph.wait_rows_ready(300) and graph.wait_mixed_ready(300) and graph.wait_few_ready(300)  # compiled in the background
    yield Pair(eager, compiled, dtype, tolerance)
    compiled.close()
    eager.close()


@pytest.fixture
def runners(pair: Pair) -> Iterator[tuple[TorchRunner, TorchRunner]]:
    """The pair with empty caches, its compiled graphs as they were after the test."""
    graph = pair.compiled.model.decode_graph
    graphs = (graph.compiled, list(graph.compiled_rows), list(graph.compiled_mixed), graph.compiled_few)
    for cache in pair.eager.k_cache + pair.eager.v_cache + pair.compiled.k_cache + pair.compiled.v_cache:
        cache.zero_()
    yield pair.eager, pair.compiled
    graph.compiled, graph.compiled_rows, graph.compiled_mixed, graph.compiled_few = graphs


def test_one_row_decode_graph_matches_eager_and_never_recompiles(runners: tuple[TorchRunner, TorchRunner], pair: Pair) -> None:
    eager, compiled = runners
    dtype, tolerance = pair.dtype, pair.tolerance
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


def test_few_token_graph_runs_every_draft_length_and_matches_eager(runners: tuple[TorchRunner, TorchRunner], pair: Pair) -> None:
    """A verify step (one sequence fed its token and a draft) runs the few-token graph, compiled
    once for every token count and context length, with the eager step's logits and cache."""
    eager, compiled = runners
    tolerance = pair.tolerance
    graph = compiled.model.decode_graph
    assert graph is not None and graph.few_ready
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



ROWS_TABLES = [list(range(4 * i, 4 * i + 4)) for i in range(7)]  # 16 slots a sequence
ROWS_PROMPTS = [[5 + i + j for j in range(3 + i)] for i in range(7)]  # 3..9 tokens: contexts of every length, padded
# Each step: the sequences that decode, and a prompt chunk beside them (sequence, tokens) or
# None. Sequence 6 is prefilled late, in two chunks beside 6 decode rows (mixed steps: the
# first, fresh, samples nothing; the second, its context gathered, samples its first token).
ROWS_SCHEDULE: list[tuple[list[int], tuple[int, int] | None]] = [
    ([0, 1], None), ([0, 1, 2], None), ([0, 1, 2, 3, 4], None), (list(range(6)), (6, 4)), (list(range(6)), (6, 5)),
    (list(range(7)), None), ([2, 3, 4, 5, 6], None), ([0, 1, 2, 3], None), ([5, 6], None),
]  # fmt: skip


def _decode_rows(runner: TorchRunner, feeds: list[list[int]] | None) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Prefill ROWS_PROMPTS[:6] in one step, then each ROWS_SCHEDULE step: its sequences fed
    their last token (their greedy one, or the next of `feeds` when given, so two runners see
    the same inputs) and its prompt chunk; every step's logits and the tokens fed."""
    assert runner.model is not None
    history = [list(p) for p in ROWS_PROMPTS[:6]] + [[]]
    logits, fed = [], []

    def step(seqs: list[tuple[int, int]], members: list[int], ids: list[int], keep: list[int]) -> torch.Tensor:
        built, positions = runner.model.build_step(seqs, [ROWS_TABLES[i] for i in members], BLOCK, runner.k_cache, runner.v_cache)
        return runner.model.forward(torch.tensor(ids), positions, built, torch.tensor(keep), runner.k_cache, runner.v_cache).float()

    with torch.inference_mode():
        ends = torch.tensor([len(p) for p in ROWS_PROMPTS[:6]]).cumsum(0) - 1
        first = step([(0, len(p)) for p in ROWS_PROMPTS[:6]], list(range(6)), [t for p in ROWS_PROMPTS[:6] for t in p], ends.tolist())
        for i, token in enumerate(first.argmax(-1).tolist()):
            history[i].append(token)
        for n, (members, chunk) in enumerate(ROWS_SCHEDULE):
            decoded = feeds[n] if feeds is not None else [history[i][-1] for i in members]
            fed.append(decoded)
            ids = list(decoded)
            seqs = [(len(history[i]) - 1, 1) for i in members]
            keep = list(range(len(members)))
            if chunk is not None:
                seq, size = chunk
                start = len(history[seq])
                history[seq] += ROWS_PROMPTS[seq][start : start + size]
                ids = ids + ROWS_PROMPTS[seq][start : start + size]
                seqs.append((start, size))
                members = [*members, seq]
                if len(history[seq]) == len(ROWS_PROMPTS[seq]):
                    keep.append(len(ids) - 1)
            out = step(seqs, members, ids, keep)
            logits.append(out)
            for i, token in zip(members, out.argmax(-1).tolist(), strict=False):
                history[i].append(token)
    return logits, fed


@pytest.mark.parametrize("pair", ["float32"], indirect=True)
def test_rows_graphs_run_every_width_and_match_eager(runners: tuple[TorchRunner, TorchRunner], pair: Pair) -> None:
    """Decode steps of 2 to 7 sequences with contexts of different lengths (padded) run the rows
    graph of their width class, compiled once for every width in it and every context length;
    beside one prompt chunk (fresh, or after its first chunk), 5 or more decode rows run the
    mixed graph. Logits and cache are the eager step's."""
    eager, compiled = runners
    tolerance = pair.tolerance
    graph = compiled.model.decode_graph
    assert graph is not None and all(graph.rows_ready(lo) for lo, _ in graph.classes)
    assert graph.classes == [(2, 4), (5, 256)]  # the attention's float32 path ends at 4 rows
    runs: list[int] = []
    for i, inner in enumerate(graph.compiled_rows):
        graph.compiled_rows[i] = lambda *args, i=i, inner=inner: runs.append(i) or inner(*args)
    assert graph.mixed == [(7, 512)] and all(graph.mixed_ready(tokens, 6) for tokens in (10, 11))
    # Only a step of one prompt chunk beside the decodes has a graph: the scheduler is asked for one.
    assert compiled.model.prompt_chunks == 1 and eager.model.prompt_chunks is None
    mixed_inner = graph.compiled_mixed[0]
    graph.compiled_mixed[0] = lambda *args: runs.append(-1) or mixed_inner(*args)
    want, feeds = _decode_rows(eager, None)
    torch._dynamo.config.error_on_recompile = True
    try:
        got, _ = _decode_rows(compiled, feeds)
    finally:
        torch._dynamo.config.error_on_recompile = False
    assert runs == [-1 if chunk else 0 if len(members) <= 4 else 1 for members, chunk in ROWS_SCHEDULE]  # every step ran its graph
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and (g - w).norm() / w.norm() < tolerance
    used = 4 * len(ROWS_TABLES) * BLOCK
    for g, w in zip(compiled.k_cache + compiled.v_cache, eager.k_cache + eager.v_cache, strict=True):
        torch.testing.assert_close(g[:, :used].float(), w[:, :used].float(), rtol=tolerance, atol=tolerance)
