"""The bucketed decode step that CUDA graphs capture (actors/runners/native/cuda_graphs.py),
checked on the CPU: CI has no GPU, so these run the same static function over the same static
buffers without capture. With SWITCHYARD_TEST_DEVICE=cuda (ops/gpu/check.sh) the comparisons
with the eager step, the warm-up captures and the engine's greedy run capture and replay real
graphs instead; the planning rules and dynamo's trace stay on the CPU.

- its logits and its cache writes equal the eager native step's, with pad rows in the bucket,
  for decode steps and for steps with prompt chunks (a row per token) beside decodes;
- steps past the largest bucket, and steps with chunks whose gather would be too large, run eager;
- it has no host sync and no data-dependent shape (what a capture needs), shown by dynamo's
  trace of it;
- greedy output through the real runtime with every decode step bucketed, eight staggered
  concurrent requests with preemption, is token-identical to transformers' `generate`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from transformers import AutoModelForCausalLM

from actors.runners.native import cuda_graphs
from actors.runners.native.cuda_graphs import BucketedDecode, DecodeBatch, batch_bucket, decode_step, length_buckets
from actors.runners.runner_config import RunnerConfig
from actors.runners.torch_runner import TorchRunner
from tests.support.device import on_gpu, suite_device
from tests.support.equivalence import SHAPES, make_prompts, reference, run_engine
from tests.support.tiny_model import build_tiny_decoder

BLOCK = 4


def test_buckets_cover_every_batch_and_length_up_to_the_limits() -> None:
    assert [batch_bucket(b) for b in (1, 2, 3, 5, 17, 33, 256, 257, 512)] == [1, 2, 4, 8, 24, 48, 256, 384, 512]
    assert batch_bucket(513) is None  # runs eager
    assert length_buckets(8192, 16) == [256, 512, 1024, 2048, 4096, 8192]
    assert length_buckets(1000, 16) == [256, 512, 1008]  # the last bucket holds max_len, in whole blocks
    assert length_buckets(100, 16) == [112]


BUCKETED = "native+cudagraphs" if on_gpu() else "native+buckets"  # captured on a GPU, not on a CPU


def _runner(model_dir: Path, **settings: object) -> TorchRunner:
    settings = {"device": suite_device(), **settings}
    runner = TorchRunner(model_dir, RunnerConfig(dtype="float32", num_kv_blocks=64, block_size=BLOCK, num_threads=1, max_model_len=300, **settings))
    runner.load()
    return runner


def _step(runner: TorchRunner, seqs: list[tuple[int, int]], tables: list[list[int]], ids: list[int], every_row: bool = False) -> torch.Tensor:
    assert runner.model is not None
    ends = [sum(n for _, n in seqs[: i + 1]) - 1 for i in range(len(seqs))]  # each sequence's last row
    with torch.inference_mode():
        step, positions = runner.model.build_step(seqs, tables, BLOCK, runner.k_cache, runner.v_cache)
        keep = torch.arange(len(ids), device=runner.device) if every_row else torch.tensor(ends, device=runner.device)
        return runner.model.forward(torch.tensor(ids, device=runner.device), positions, step, keep, runner.k_cache, runner.v_cache).float()


@pytest.mark.parametrize("shape", ["qwen2-gqa-biases", "qwen3-qk-norm-tied"])
def test_bucketed_decode_matches_the_eager_step_with_pad_rows(shape: str, tmp_path: Path) -> None:
    family, overrides = SHAPES[shape]
    model_dir = build_tiny_decoder(tmp_path, family, **overrides)
    eager, bucketed = _runner(model_dir, cuda_graphs=False), _runner(model_dir, cuda_graphs=True)
    assert bucketed.model is not None and bucketed.model.impl == BUCKETED and eager.model.impl == "native"
    graphs = bucketed.model.bucketed
    assert graphs is not None
    gen = torch.Generator().manual_seed(0)
    lengths = [3, 9, 6, 14, 5]  # prompts; contexts then grow across block boundaries
    tables = [list(range(i * 12, (i + 1) * 12)) for i in range(len(lengths))]
    prompts = [torch.randint(3, 300, (n,), generator=gen).tolist() for n in lengths]
    seqs = [(0, n) for n in lengths]
    flat = [t for p in prompts for t in p]
    plan = bucketed.model.build_step(seqs, tables, BLOCK, bucketed.k_cache, bucketed.v_cache)[0]
    assert isinstance(plan, DecodeBatch) and plan.batch == 48  # the prompts' 37 tokens, a row each
    last = _step(eager, seqs, tables, flat)
    torch.testing.assert_close(_step(bucketed, seqs, tables, flat), last, rtol=1e-4, atol=1e-4)
    tokens = last.argmax(-1).tolist()
    done = list(lengths)
    # decode steps of 5 (bucket 8), then 3 (bucket 4), then 1 sequence: pads in every bucket but 1
    for live in [[0, 1, 2, 3, 4]] * 3 + [[1, 3, 4]] * 3 + [[3]] * 2:
        step_seqs = [(done[i], 1) for i in live]
        step_tables = [tables[i] for i in live]
        ids = [tokens[i] for i in live]
        plan = bucketed.model.build_step(step_seqs, step_tables, BLOCK, bucketed.k_cache, bucketed.v_cache)[0]
        assert isinstance(plan, DecodeBatch) and plan.batch == batch_bucket(len(live)) and plan.length == 256
        want = _step(eager, step_seqs, step_tables, ids)
        got = _step(bucketed, step_seqs, step_tables, ids)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for i, row in zip(live, want.argmax(-1).tolist()):
            tokens[i] = row
            done[i] += 1
    assert sorted(graphs.runs) == [(1, 256), (4, 256), (8, 256), (48, 256)]  # one run per bucket, reused
    for got_cache, want_cache in zip(bucketed.k_cache + bucketed.v_cache, eager.k_cache + eager.v_cache, strict=True):
        torch.testing.assert_close(got_cache, want_cache, rtol=1e-5, atol=1e-5)  # pads wrote nothing else


def test_prompt_chunks_beside_decodes_run_bucketed_a_row_per_token(tiny_model_dir: Path) -> None:
    """Fresh prompts, a prompt's later chunk (its keys partly in the cache already, partly in
    the same step) and decodes side by side: every row's logits and every cache write as eager."""
    eager, bucketed = _runner(tiny_model_dir, cuda_graphs=False), _runner(tiny_model_dir, cuda_graphs=True)
    assert bucketed.model is not None and bucketed.model.bucketed is not None
    gen = torch.Generator().manual_seed(1)
    tables = [list(range(i * 16, (i + 1) * 16)) for i in range(3)]
    ids = lambda n: torch.randint(3, 300, (n,), generator=gen).tolist()  # noqa: E731
    steps = [
        [(0, 7), (0, 5)],  # two fresh prompts
        [(7, 1), (5, 6), (0, 3)],  # a decode, the second prompt's next chunk (it crosses a block), a third prompt
        [(8, 1), (11, 1), (3, 4)],  # two decodes and the third prompt's next chunk
    ]
    for seqs in steps:
        step_ids = ids(sum(n for _, n in seqs))
        plan = bucketed.model.build_step(seqs, tables[: len(seqs)], BLOCK, bucketed.k_cache, bucketed.v_cache)[0]
        assert isinstance(plan, DecodeBatch) and len(plan.lens) == len(step_ids)
        want = _step(eager, seqs, tables[: len(seqs)], step_ids, every_row=True)
        got = _step(bucketed, seqs, tables[: len(seqs)], step_ids, every_row=True)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for got_cache, want_cache in zip(bucketed.k_cache + bucketed.v_cache, eager.k_cache + eager.v_cache, strict=True):
        torch.testing.assert_close(got_cache, want_cache, rtol=1e-5, atol=1e-5)


def test_oversized_steps_stay_eager(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = _runner(tiny_model_dir, cuda_graphs=True, device="cpu", max_step_tokens=512)  # planning rules, and the CPU's defaults
    assert runner.model is not None and runner.model.bucketed is not None
    graphs = runner.model.bucketed
    assert graphs.batches[-1] == 512  # a row per token of the step's token budget
    assert graphs.plan([(4, 1)] * 512, [[0, 1]] * 512) is not None
    assert graphs.plan([(4, 1)] * 513, [[0, 1]] * 513) is None  # past the largest bucket
    assert graphs.plan([(0, 300)], [list(range(75))]) is not None  # max_model_len 300: the last length bucket
    assert graphs.plan([(299, 1)], [list(range(75))]) is not None
    # A step with a chunk whose rows would gather too much runs eager; a decode step never does.
    per_key = runner.model.cfg.num_kv_heads * runner.model.cfg.head_dim
    monkeypatch.setattr(cuda_graphs, "MIXED_GATHER_ELEMENTS", 8 * 256 * per_key)
    assert graphs.plan([(0, 8)], [[0, 1]]) is not None  # 8 rows x 256 keys: at the limit
    assert graphs.plan([(0, 9)], [[0, 1, 2]]) is None  # 16 rows (its bucket) x 256: past it
    assert graphs.plan([(4, 1)] * 64, [[0, 1]] * 64) is not None
    # Off unless asked for on a CPU, and never with batch invariance (it buckets decodes its own way).
    assert _runner(tiny_model_dir, device="cpu").model.bucketed is None  # type: ignore[union-attr]
    assert _runner(tiny_model_dir, cuda_graphs=True, batch_invariant=True, device="cpu").model.bucketed is None  # type: ignore[union-attr]


def _data_dependent_ops(fn: object, *args: object) -> list[str]:
    """The ops of `fn`'s one dynamo graph whose value or shape depends on tensor data (a scalar
    read back to the host, a boolean-mask index, `nonzero`): each is a host sync on a GPU."""
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend=keep, dynamic=False)(*args)  # type: ignore[call-overload]
    return [node.format_node() for gm in graphs for node in gm.graph.nodes if free_unbacked_symbols(node.meta.get("example_value"))]


@pytest.mark.parametrize("lora", [False, True])
def test_the_bucketed_step_has_no_host_sync_or_data_dependent_shape(tiny_model_dir: Path, lora: bool, request: pytest.FixtureRequest) -> None:
    """What a CUDA graph capture needs, shown on a CPU through dynamo's trace of the step (a
    graph break fails fullgraph; a data-dependent op leaves an unbacked symbol, as the
    controls on the last lines show); with LoRA adapters on its rows too (native/lora.py: no
    graph break; dynamo takes the adapters' static buffers as constants, so what they hold is
    tests/engine/test_lora.py's bucketed test's)."""
    from runtime.adapters import LoraSettings, read_adapter

    adapters = request.getfixturevalue("lora_adapters") if lora else {}
    settings = LoraSettings(tuple(read_adapter(n, str(p), 16) for n, p in adapters.items()), 4, 16) if lora else None
    runner = _runner(tiny_model_dir, cuda_graphs=True, device="cpu", lora=settings)  # dynamo traces the CPU step: CI's stand-in for a capture
    assert runner.model is not None and runner.model.bucketed is not None
    graphs: BucketedDecode = runner.model.bucketed
    lens = torch.tensor([5, 9, 9, 9])
    tables = torch.arange(4 * 64).view(4, 64) % runner.k_cache[0].shape[1] // BLOCK
    ids = torch.tensor([7, 8, 9, 9])
    if lora:
        runner.model.adapters.rows(["qv-r4", None, "all-r8", "all-r8"], runner.device)
    with torch.inference_mode():
        assert _data_dependent_ops(decode_step, graphs.model, ids, lens, tables, runner.k_cache, runner.v_cache, BLOCK) == []
    x = torch.randn(8)
    assert _data_dependent_ops(lambda x: x * x.sum().item(), x)
    assert _data_dependent_ops(lambda x: x[x > 0].sum(), x)
    assert _data_dependent_ops(lambda x: x.nonzero().float().sum(), x)


def test_capture_all_prepares_every_batch_bucket_up_to_max_num_seqs(tiny_model_dir: Path) -> None:
    runner = _runner(tiny_model_dir, cuda_graphs=True, max_num_seqs=6, max_step_tokens=5)
    assert runner.model is not None and runner.model.bucketed is not None
    graphs = runner.model.bucketed
    assert graphs.batches == (1, 2, 4, 8)  # 6 sequences, 5 tokens a step at most: nothing past the bucket holding them
    with torch.inference_mode():
        graphs.capture_all(runner.k_cache, runner.v_cache)
    assert sorted(graphs.runs) == [(1, 256), (2, 256), (4, 256), (8, 256)]
    assert graphs.plan([(3, 1)] * 9, [[0]] * 9) is None  # past max_num_seqs: eager
    assert graphs.plan([(0, 9)], [[0, 1, 2]]) is None  # past the step's token budget: eager


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")
@pytest.mark.parametrize("device", ["cuda:0", "cuda:1"])
def test_on_a_gpu_replays_match_the_eager_step_without_host_syncs(tiny_model_dir: Path, device: str) -> None:
    """The captured path itself: two different steps in one bucket (a stale replay would repeat
    the first), a replay with sync debugging raising on any host sync, and a device other than
    the current one (the capture must land there)."""
    if int(device.split(":")[1]) >= torch.cuda.device_count():
        pytest.skip(f"no {device}")
    eager, graphed = _runner(tiny_model_dir, device=device, cuda_graphs=False), _runner(tiny_model_dir, device=device)
    assert graphed.model is not None and graphed.model.impl == "native+cudagraphs"
    tables = [list(range(i * 12, (i + 1) * 12)) for i in range(3)]
    for runner in (eager, graphed):
        _step(runner, [(0, 5)] * 3, tables, list(range(3, 18)))
    for pos, ids in ((5, [4, 5, 6]), (6, [7, 8, 9])):
        want = _step(eager, [(pos, 1)] * 3, tables, ids)
        got = _step(graphed, [(pos, 1)] * 3, tables, ids)
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-3, atol=1e-3)
    replay = graphed.model.bucketed.runs[(4, 256)]  # type: ignore[union-attr]
    torch.cuda.set_sync_debug_mode("error")
    try:
        replay()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize(device)


async def test_greedy_matches_generate_with_every_step_bucketed(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    replays: list[int] = []
    inner = cuda_graphs.BucketedDecode.__call__

    def counted(self: BucketedDecode, *args: object, **kwargs: object) -> torch.Tensor:
        replays.append(1)
        return inner(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cuda_graphs.BucketedDecode, "__call__", counted)
    prompts = make_prompts(AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size)
    expected = reference(tiny_model_dir, prompts)
    got, stats = await run_engine(tiny_model_dir, prompts, num_kv_blocks=40, max_num_batched_tokens=16, cuda_graphs=True)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"prompt {i} (len {len(prompts[i])}) diverged"
    assert replays and stats["preemptions"] > 0 and stats["kv_blocks_used"] == 0
