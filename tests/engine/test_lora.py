"""LoRA adapters on the native path (actors/runners/native/lora.py, runtime/adapters.py): tiny
adapters made with PEFT on two target sets and two ranks (one rsLoRA), served beside their base:
greedy output of each of the four equal to PEFT's own (`PeftModel`, float32), alone and with all
four and the base mixed in one batch; on the shipped-style int4 base within a stated KL of PEFT on
the dense weights; and what an adapter holds that is not served is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from actors.runners.native.lora import Adapters
from actors.runners.runner_config import RunnerConfig
from runtime.adapters import LoraSettings, lora_error, read_adapter
from runtime.request import Prompt
from tests.support.adapters import ADAPTERS, peft_greedy
from tests.support.cli import assert_one_line_usage_error, run_cli
from tests.support.device import needs_kernels
from tests.support.equivalence import NUM_NEW, greedy_concurrently, make_prompts


def _served(tiny_model_dir: Path, lora_adapters: dict[str, Path], **overrides: object) -> dict[str, object]:
    return dict(enable_lora=True, lora_modules={n: str(p) for n, p in lora_adapters.items()}, spec_decoding="off", model_impl="native", **overrides)


async def test_each_adapter_serves_peft_s_tokens_alone_and_mixed_in_one_batch(tiny_model_dir: Path, lora_adapters: dict[str, Path]) -> None:
    prompts = make_prompts(100)[2:6]
    expected = {name: peft_greedy(tiny_model_dir, lora_adapters.get(name) if name else None, prompts) for name in [None, *ADAPTERS]}
    assert len({tuple(map(tuple, expected[name])) for name in expected}) == len(expected)  # each adapter changes the answer
    for name in ADAPTERS:  # alone
        got, _ = await greedy_concurrently(tiny_model_dir, [Prompt(token_ids=p) for p in prompts], NUM_NEW, 0.0, [name] * len(prompts), **_served(tiny_model_dir, lora_adapters))
        assert got == expected[name], name
    # every prompt for the base and each of the 4 adapters at once: steps carry rows of all five
    per = len(ADAPTERS) + 1
    names = [None, *ADAPTERS] * len(prompts)
    want = [expected[name][i // per] for i, name in enumerate(names)]
    got, seen, adapters = await _mixed(tiny_model_dir, lora_adapters, prompts, names)
    assert got == want and max(seen) == per and adapters.fills == len(ADAPTERS)  # each slot filled once, on first use
    # two slots and two adapters kept in host memory: at most two adapters a step, the rest wait
    # for a slot; four adapters through two slots: slots given up and filled again, adapters
    # read from their directories again (two of four held in host memory)
    got, seen, adapters = await _mixed(tiny_model_dir, lora_adapters, prompts, names, max_loras=2, max_cpu_loras=2)
    assert got == want and max(seen) <= 3 and adapters.fills >= len(ADAPTERS) and len(adapters.host) == 2, (seen, adapters.fills)
    print(f"2 slots, 4 adapters: {adapters.fills} fills, {1e3 * adapters.fill_seconds / adapters.fills:.2f} ms each")


async def _mixed(
    model_dir: Path, lora_adapters: dict[str, Path], prompts: list[list[int]], names: list[str | None], **overrides: object
) -> tuple[list[list[int]], list[int], Adapters]:
    """Each prompt once for each name in one engine: the tokens, the adapters (base too) each
    step carried, and the runner's `Adapters`."""
    seen: list[int] = []
    held: list[Adapters] = []
    rows = Adapters.rows

    def spy(self: Adapters, step_names: list[str | None], device: torch.device) -> None:
        seen.append(len(set(step_names)))
        held.append(self)
        rows(self, step_names, device)

    mixed = [p for p in prompts for _ in range(len(names) // len(prompts))]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Adapters, "rows", spy)
        got, _ = await greedy_concurrently(
            model_dir, [Prompt(token_ids=p) for p in mixed], NUM_NEW, 0.0, names, **_served(model_dir, lora_adapters, **overrides)
        )
    return got, seen, held[-1]


async def test_the_bucketed_steps_cuda_graphs_capture_take_adapters(tiny_model_dir: Path, lora_adapters: dict[str, Path]) -> None:
    """The decode buckets CUDA graphs capture (here the same static function uncaptured; on a GPU,
    ops/gpu/check.sh's tests stage, captured and replayed): each row's adapter gathered through
    static buffers, pad rows as the last real row; the mixed batch's greedy tokens are PEFT's."""
    prompts = make_prompts(100)[4:6]
    names: list[str | None] = [None, *ADAPTERS] * len(prompts)
    expected = {name: peft_greedy(tiny_model_dir, lora_adapters.get(name) if name else None, prompts) for name in [None, *ADAPTERS]}
    want = [expected[name][i // (len(ADAPTERS) + 1)] for i, name in enumerate(names)]
    in_graph: list[int] = []
    apply = Adapters.apply

    def spy(self: Adapters, y: torch.Tensor, x: torch.Tensor, layer: int, module: str) -> torch.Tensor:
        if self.in_graph:
            in_graph.append(x.shape[0])
        return apply(self, y, x, layer, module)

    mixed = [Prompt(token_ids=p) for p in prompts for _ in range(len(ADAPTERS) + 1)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Adapters, "apply", spy)
        got, _ = await greedy_concurrently(tiny_model_dir, mixed, NUM_NEW, 0.0, names, **_served(tiny_model_dir, lora_adapters, cuda_graphs=True))
    assert got == want and in_graph, len(in_graph)


@needs_kernels()
async def test_adapters_draft_from_their_own_requests_and_drafting_changes_no_token(tiny_model_dir: Path, lora_adapters: dict[str, Path]) -> None:
    """bf16 on the row-invariant kernels, `--spec-decoding auto` (n-grams, each adapter's pool
    its own): the mixed batch's tokens equal drafting off's, and drafts were verified."""
    names: list[str | None] = [None, "qv-r4", "all-r8", "qv-r8"]  # four rows: auto drafts in steps of up to four
    mixed = [Prompt(token_ids=make_prompts(100)[2])] * len(names)
    settings = _served(tiny_model_dir, lora_adapters, dtype="bfloat16", max_num_batched_tokens=128)
    off, _ = await greedy_concurrently(tiny_model_dir, mixed, 4 * NUM_NEW, 0.0, names, **settings)
    settings["spec_decoding"] = "auto"
    drafted, stats = await greedy_concurrently(tiny_model_dir, mixed, 4 * NUM_NEW, 0.0, names, **settings)
    assert drafted == off and stats["spec_draft_tokens"] > 0, stats


async def test_an_adapters_prefix_cache_is_its_own(tiny_model_dir: Path, lora_adapters: dict[str, Path]) -> None:
    """One prompt for an adapter, another adapter, the base, then the first adapter again, each
    after the one before has cached its blocks: only the last finds any, its own adapter's."""
    prompt = make_prompts(100)[5]
    names: list[str | None] = ["qv-r4", "all-r8", None, "qv-r4"]
    got, stats = await greedy_concurrently(tiny_model_dir, [Prompt(token_ids=prompt)] * 4, NUM_NEW, 0.3, names, **_served(tiny_model_dir, lora_adapters))
    assert got[0] == got[3] and len({tuple(g) for g in got}) == 3
    assert stats["prefix_hits"] == len(prompt) // 4  # the repeat's full blocks (block size 4), and nothing else


async def test_an_int4_base_takes_adapters_within_the_bound(tiny_model_dir: Path, lora_adapters: dict[str, Path]) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from actors.runners.torch_runner import TorchRunner

    configs = tuple(read_adapter(n, str(p), 16) for n, p in lora_adapters.items())
    lora = LoraSettings(configs, 4, 16)
    runner = TorchRunner(tiny_model_dir, RunnerConfig(device="cpu", dtype="float32", compile=False, num_kv_blocks=16, block_size=16, model_impl="native", quantization="int4", lora=lora))
    runner.load()
    assert runner.model is not None and runner.model.impl.endswith("+lora"), runner.model.impl
    prompt = make_prompts(100)[6]
    own = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), lora_adapters["all-r8"]).eval()
    with torch.inference_mode():
        expected = torch.log_softmax(own(input_ids=torch.tensor([prompt])).logits[0], -1)
        step, positions = runner.model.build_step([(0, len(prompt))], [[0, 1, 2]], 16, runner.k_cache, runner.v_cache)
        runner.model.adapters.rows(["all-r8"] * len(prompt), runner.device)
        served = torch.log_softmax(runner.model.forward(torch.tensor(prompt), positions, step, torch.arange(len(prompt)), runner.k_cache, runner.v_cache).float(), -1)
    kl = float((expected.exp() * (expected - served)).sum(-1).max())
    print(f"int4 base + all-r8: KL per position at most {kl:.3g} nats")
    assert kl <= 0.05


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"use_dora": True}, "DoRA"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"r": 64}, "over --max-lora-rank 16"),
        ({"target_modules": ["q_proj", "embed_tokens"]}, "target_modules"),
        ({"bias": "lora_only"}, "bias"),
    ],
)
def test_what_an_adapter_holds_that_is_not_served_is_refused_in_one_line(lora_adapters: dict[str, Path], tmp_path: Path, change: dict, expected: str) -> None:
    import shutil

    copy = Path(shutil.copytree(lora_adapters["qv-r4"], tmp_path / "copy"))
    config = json.loads((copy / "adapter_config.json").read_text())
    (copy / "adapter_config.json").write_text(json.dumps({**config, **change}))
    error = lora_error({"x": str(copy)}, True, 4, 16, "tiny")
    assert error is not None and expected in error and "\n" not in error, error
    assert lora_error({"x": str(lora_adapters["qv-r4"])}, True, 4, 16, "tiny") is None
    assert "--enable-lora" in (lora_error({"x": str(copy)}, False, 4, 16, "tiny") or "")
    assert "--max-cpu-loras 2" in (lora_error({}, True, 4, 16, "tiny", max_cpu_loras=2) or "")
    assert "draft model" in (lora_error({}, True, 4, 16, "tiny", "draft") or "") and lora_error({}, True, 4, 16, "tiny", "ngram") is None


def test_the_command_line_refuses_an_adapter_it_cannot_serve_in_one_line(tiny_model_dir: Path, lora_adapters: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    dora = Path(shutil.copytree(lora_adapters["qv-r4"], tmp_path / "dora"))
    config = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    flags = ("serve", "--model", str(tiny_model_dir), "--no-embeddings", "--enable-lora", "--spec-decoding", "off")
    assert_one_line_usage_error(run_cli(*flags, "--lora-modules", f"d={dora}", tmp_path=tmp_path), "--lora-modules d=", "DoRA")
    drafted = run_cli(*flags[:-1], "draft", "--draft-model", str(tiny_model_dir), "--lora-modules", f"a={lora_adapters['qv-r4']}", tmp_path=tmp_path)
    assert_one_line_usage_error(drafted, "--enable-lora", "draft model")


@needs_kernels()
def test_the_row_invariant_kernels_take_adapters_and_keep_every_row_invariant(tiny_model_dir: Path, lora_adapters: dict[str, Path]) -> None:
    """The CPU's default (bf16, the row-invariant kernels) with adapters: an adapter's rows within
    1.5x PEFT's own bf16 noise of PEFT in float32; a base request's and an adapter's logits the same
    bits alone and beside each other in one step."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from actors.runners.torch_runner import TorchRunner

    lora = LoraSettings(tuple(read_adapter(n, str(p), 16) for n, p in lora_adapters.items()), 4, 16)
    runner = TorchRunner(tiny_model_dir, RunnerConfig(device="cpu", dtype="bfloat16", compile=False, num_kv_blocks=16, block_size=16, model_impl="native", lora=lora))
    runner.load()
    assert runner.model is not None and runner.model.impl == "native+bf16+rowwise+lora", runner.model.impl
    base, tuned = make_prompts(100)[6], make_prompts(100)[7]

    def logits(seqs: list[list[int]], names: list[str | None]) -> torch.Tensor:
        assert runner.model is not None
        with torch.inference_mode():
            step, positions = runner.model.build_step([(0, len(s)) for s in seqs], [[4 * i + j for j in range(4)] for i in range(len(seqs))], 16, runner.k_cache, runner.v_cache)
            runner.model.adapters.rows([name for s, name in zip(seqs, names) for _ in s], runner.device)
            ids = torch.tensor([t for s in seqs for t in s])
            return runner.model.forward(ids, positions, step, torch.arange(ids.shape[0]), runner.k_cache, runner.v_cache).float()

    alone, tuned_alone = logits([base], [None]), logits([tuned], ["all-r8"])
    mixed = logits([base, tuned], [None, "all-r8"])
    assert torch.equal(mixed[: len(base)], alone) and torch.equal(mixed[len(base) :], tuned_alone)  # every row: the same bits in any batch
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        base_kl = _kl(plain(input_ids=torch.tensor([base])).logits[0], alone)
        own = PeftModel.from_pretrained(plain, lora_adapters["all-r8"]).eval()
        expected = own(input_ids=torch.tensor([tuned])).logits[0]
        kl = _kl(expected, mixed[len(base) :])
        peft_bf16 = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16), lora_adapters["all-r8"]).eval()
        bf16_kl = _kl(expected, peft_bf16(input_ids=torch.tensor([tuned])).logits[0])  # PEFT's own bf16, against its float32
    print(f"bf16 row-invariant kernels, KL per position at most: base {base_kl:.3g}, all-r8 {kl:.3g} (PEFT's own bf16: {bf16_kl:.3g}) nats")
    assert base_kl <= 1e-3 and kl <= 1.5 * bf16_kl  # the adapter's rows: bf16 weights, as PEFT's own bf16 rounds (its A and B, its x A^T)


def _kl(reference: torch.Tensor, served: torch.Tensor) -> float:
    """The largest KL(reference || served) of a position, in nats."""
    expected, got = torch.log_softmax(reference.float(), -1), torch.log_softmax(served.float(), -1)
    return float((expected.exp() * (expected - got)).sum(-1).max())
