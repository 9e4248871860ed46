"""Speculative decoding from a draft model (--spec-decoding draft) on the tiny model: the same
tokens as without it.

Greedy, seeded-sampling, penalized and logprob requests run concurrently and staggered, half
of them sharing a prompt prefix (prefix cache hits), also with a small KV cache (preemption),
with three draft models: the target's own weights (its greedy token is the target's, so nearly
every draft is kept), the target's weights plus noise (about half kept), and another random
model with the same tokenizer (almost none kept). Each request's tokens and logprobs must equal
those with drafting off, and every KV block and runner state must come back. The runner alone:
the draft model's KV cache holds what the target's holds once a step ends (the draft model sees
every token the target computes, the last token of a kept draft included).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actors.build import build_engine
from runtime.request import Prompt
from runtime.sampling import SamplingParams
from tests.support.servers import tiny_config
from tests.support.spec import leave_mid_draft

SHARED = [40, 41, 42, 43, 44, 45, 46, 47, 48]  # two blocks and a bit: later requests hit the prefix cache
REQUESTS = [
    ([*SHARED, 5, 6], SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)),
    ([12, 13, 14], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)),
    ([*SHARED, 20, 21], SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=40, ignore_eos=True)),
    ([*SHARED, 60], SamplingParams(temperature=0.6, seed=8, max_tokens=36, ignore_eos=True, stop_token_ids=[9])),
    ([30, 31, 30, 31], SamplingParams(temperature=0.0, frequency_penalty=0.4, repetition_penalty=1.1, max_tokens=36, ignore_eos=True)),
    ([*SHARED, 7, 8], SamplingParams(temperature=0.0, logprobs=2, max_tokens=36, ignore_eos=True)),
]


@pytest.fixture(scope="module")
def drafts(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.support.tiny_model import build_noisy_copy, build_tiny_llama

    return {
        "itself": tiny_model_dir,
        "noisy": build_noisy_copy(tiny_model_dir, tmp_path_factory.mktemp("tiny-noisy")),
        "other": build_tiny_llama(tmp_path_factory.mktemp("tiny-other"), seed=1, layers=1),
    }


async def run(model_dir: Path, draft: Path | None, **overrides: object) -> tuple[list[list[int]], dict, list[list[float]]]:
    spec = {"spec_decoding": "draft", "draft_model": str(draft)} if draft is not None else {}
    engine = build_engine(tiny_config(model_dir, **spec, **overrides))
    tokens: list[list[int]] = [[] for _ in REQUESTS]
    logprobs: list[list[float]] = [[] for _ in REQUESTS]
    greedy = [0, 0]  # draft tokens and kept ones of the plain greedy requests, from the finish counts (as logged)

    def count(state: object, finish: object, now: float) -> None:
        sampling = state.start.sampling  # type: ignore[attr-defined]
        if sampling.temperature == 0.0 and not sampling.has_penalties:
            greedy[0] += state.num_draft_tokens  # type: ignore[attr-defined]
            greedy[1] += state.num_accepted_tokens  # type: ignore[attr-defined]

    engine.on_finish.append(count)

    async def one(i: int) -> None:
        await trio.sleep(0.01 * i)
        prompt, sampling = REQUESTS[i]
        async with engine.submit(Prompt(token_ids=prompt), sampling) as stream:
            async for delta in stream:
                tokens[i] += delta.token_ids
                logprobs[i] += [entry.logprob for entry in delta.logprobs or ()]

    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with trio.open_nursery() as clients:
            for i in range(len(REQUESTS)):
                clients.start_soon(one, i)
        async with engine.submit(Prompt(token_ids=[9, 9]), SamplingParams(max_tokens=2, ignore_eos=True)) as stream:
            assert sum([len(d.token_ids) async for d in stream]) == 2  # its plans free the others' runner states
        stats = {**engine.statistics(), "runner_states": len(engine.runner.requests), "greedy": greedy}  # type: ignore[attr-defined]
        nursery.cancel_scope.cancel()
    return tokens, stats, logprobs


@pytest.mark.parametrize("overrides", [pytest.param({}, id="roomy"), pytest.param({"num_kv_blocks": 40}, id="small-cache")])
async def test_drafts_change_no_token(tiny_model_dir: Path, drafts: dict[str, Path], overrides: dict) -> None:
    plain, plain_stats, plain_logprobs = await run(tiny_model_dir, None, **overrides)
    assert all(plain) and plain_stats["prefix_hits"] > 0
    if overrides:
        assert plain_stats["preemptions"] > 0, plain_stats
    for name, draft in drafts.items():
        drafted, stats, drafted_logprobs = await run(tiny_model_dir, draft, **overrides)
        assert drafted == plain, name
        # Each kept draft token's logprob comes from its own verify row: the step-by-step values.
        assert drafted_logprobs[-1] == pytest.approx(plain_logprobs[-1], abs=1e-4), name
        assert stats["spec_draft_tokens"] > 0 and stats["prefix_hits"] > 0, (name, stats)
        assert stats["kv_blocks_used"] == 0 and stats["requests"] == 0 and stats["runner_states"] <= 1, (name, stats)  # the flushing request's own
        if name == "itself":  # its greedy token is the target's: a greedy request keeps (nearly) every draft
            drafted_greedy, kept_greedy = stats["greedy"]
            assert drafted_greedy > 40 and kept_greedy >= 0.95 * drafted_greedy, stats
        if name == "noisy":
            assert stats["spec_accepted_tokens"] > 0, stats


async def test_clients_leaving_mid_draft_free_every_block_and_runner_state(tiny_model_dir: Path) -> None:
    """Each client leaves after a few tokens (an abort while its draft may be in the step), beside
    one that runs to the end; every KV block, the core's requests and the runner's states come
    back (one last request's plan frees the rest)."""
    leave_after = [3, 5, 8, 13, 21]
    received, stats, kept, drafted_before = await leave_mid_draft(tiny_config(tiny_model_dir, spec_decoding="draft", draft_model=str(tiny_model_dir), num_kv_blocks=48), lambda i: [*SHARED, i], leave_after)
    assert len(received) == len(leave_after) and max(received) < 60
    assert stats["spec_draft_tokens"] > drafted_before, stats
    assert stats["kv_blocks_used"] == 0 and stats["requests"] == 0 and stats["live_requests"] == 0, stats
    assert kept == 1


async def test_a_transformers_target_drafts_with_a_native_draft_model(tiny_model_dir: Path) -> None:
    """The draft model is native whatever the target's path: greedy tokens the same as without."""
    overrides = {"model_impl": "transformers"}
    plain, _, _ = await run(tiny_model_dir, None, **overrides)
    drafted, stats, _ = await run(tiny_model_dir, tiny_model_dir, **overrides)
    assert drafted == plain and stats["spec_accepted_tokens"] > 0, stats


def test_the_draft_cache_holds_what_the_target_cache_holds(tiny_model_dir: Path) -> None:
    """The runner alone, drafting with the target's own weights: after each step the draft
    model's K/V at every computed position equal the target's (so a block the prefix cache hands
    on, or a preempted request's recomputed one, is whole in both), a kept draft's last token
    included; and a draft that is the true continuation is kept whole."""
    import torch

    from actors.runners.runner_config import RunnerConfig
    from actors.runners.torch_runner import TorchRunner
    from runtime.messages import DRAFT_TOKEN, NewRequest, ScheduledSeq, StepPlan

    greedy = SamplingParams(temperature=0.0, max_tokens=64)
    runner = TorchRunner(tiny_model_dir, RunnerConfig(dtype="float32", num_kv_blocks=64, block_size=4, num_threads=1, draft_model=tiny_model_dir))
    runner.load()
    prompt = [5, 6, 7, 5, 6, 7, 11]
    table = list(range(3, 19))

    def step(tokens: list[int], start: int, draft: int = 0, new: bool = False, copies: tuple[tuple[int, int], ...] = ()) -> tuple[int, int, list[int]]:
        seq = ScheduledSeq(request_id="a", token_ids=[*tokens, *[DRAFT_TOKEN] * draft], start_pos=start, block_table=table, sample=True, sampling=greedy, seed=0, num_prompt_tokens=len(prompt), num_draft_tokens=draft)
        plan = StepPlan(step_id=0, seqs=(seq,), new_requests=(NewRequest(request_id="a", prompt_token_ids=tuple(prompt)),) if new else (), block_copies=copies)
        result = runner.execute(plan)
        return result.sampled["a"], result.accepted.get("a", 0), result.drafted.get("a", [])

    def same_caches(slots: list[int]) -> bool:
        assert runner.draft is not None
        pairs = zip((*runner.k_cache, *runner.v_cache), runner.draft.caches())
        return all(torch.allclose(ours[:, slots], theirs[:, slots], atol=1e-4) for ours, theirs in pairs)

    def slots(length: int) -> list[int]:
        return [table[p // 4] * 4 + p % 4 for p in range(length)]

    try:
        token, _, _ = step(prompt, 0, new=True)
        history = [*prompt, token]
        for k in (3, 1, 4, 2):
            sampled, kept, draft = step([history[-1]], len(history) - 1, draft=k)
            assert len(draft) == k and kept == k, (k, kept)
            history += [*draft, sampled]
            assert same_caches(slots(len(history) - 1)), k  # every position but the one the next step feeds
        # A copy-on-write block copy (a forked sibling's) copies the draft model's block too.
        step([history[-1]], len(history) - 1, copies=((table[0], 40),))
        assert same_caches(list(range(160, 164))) and runner.k_cache[0][:, 160:164].abs().sum() > 0
    finally:
        runner.close()
