"""Speculative decoding (--spec-decoding ngram) on the tiny model: the same tokens as without it.

Greedy, seeded-sampling and penalized requests run concurrently, staggered, also with a small
KV cache; a random tiny model falls into loops, which n-gram drafts catch. Each request's
tokens must equal those with drafting off (the runner samples every verify row as the
step-by-step loop samples that position), drafts must have been kept, and every KV block and
runner state must come back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actors.build import build_engine
from runtime.request import Prompt
from runtime.sampling import SamplingParams
from tests.support.servers import tiny_config
from tests.support.spec import always_draft, leave_mid_draft

REQUESTS = [
    ([5, 6, 7, 5, 6, 7, 5, 6, 7], SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)),
    ([12, 13, 14], SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)),
    ([20, 21, 22, 23, 24, 25, 26, 27], SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=50, ignore_eos=True)),
    ([40, 41], SamplingParams(temperature=0.6, seed=8, max_tokens=40, ignore_eos=True, stop_token_ids=[9])),
    ([30, 31, 30, 31], SamplingParams(temperature=0.0, frequency_penalty=0.4, repetition_penalty=1.1, max_tokens=40, ignore_eos=True)),
    ([7, 8, 7, 8, 7, 8], SamplingParams(temperature=0.0, logprobs=2, max_tokens=40, ignore_eos=True)),
]


async def run(model_dir: Path, spec: str, **overrides: object) -> tuple[list[list[int]], dict, list[list[float]]]:
    engine = build_engine(tiny_config(model_dir, spec_decoding=spec, **overrides))
    tokens: list[list[int]] = [[] for _ in REQUESTS]
    logprobs: list[list[float]] = [[] for _ in REQUESTS]

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
        stats = engine.statistics()
        nursery.cancel_scope.cancel()
    return tokens, stats, logprobs


@pytest.mark.parametrize("overrides", [pytest.param({}, id="roomy"), pytest.param({"num_kv_blocks": 48}, id="small-cache")])
async def test_drafts_change_no_token(tiny_model_dir: Path, overrides: dict) -> None:
    plain, _, plain_logprobs = await run(tiny_model_dir, "off", **overrides)
    drafted, stats, drafted_logprobs = await run(tiny_model_dir, "ngram", **overrides)
    assert drafted == plain and all(plain)
    # Each kept draft token's logprob comes from its own verify row: the step-by-step values.
    assert len(drafted_logprobs[-1]) == len(plain[-1]) and drafted_logprobs[-1] == pytest.approx(plain_logprobs[-1], abs=1e-4)
    assert stats["spec_accepted_tokens"] > 0, stats
    assert stats["kv_blocks_used"] == 0 and stats["requests"] == 0


def test_a_verify_row_samples_what_the_step_by_step_loop_samples(tiny_model_dir: Path) -> None:
    """The runner alone: a draft that is the true continuation is kept whole, and the token after
    it is the step-by-step loop's, penalties counting the draft tokens before each row."""
    from actors.runners.runner_config import RunnerConfig
    from actors.runners.torch_runner import TorchRunner
    from runtime.messages import NewRequest, ScheduledSeq, StepPlan

    sampling = SamplingParams(temperature=0.0, frequency_penalty=1.5, presence_penalty=0.5, repetition_penalty=1.5, max_tokens=16)
    runner = TorchRunner(tiny_model_dir, RunnerConfig(dtype="float32", num_kv_blocks=64, block_size=4, num_threads=1))
    runner.load()

    def step(rid: str, tokens: list[int], start: int, draft: int = 0, new: tuple[int, ...] = ()) -> tuple[int, int]:
        seq = ScheduledSeq(request_id=rid, token_ids=tokens, start_pos=start, block_table=list(range(16 * (rid == "b"), 16 * (rid == "b") + 16)), sample=True, sampling=sampling, seed=0, num_prompt_tokens=6, num_draft_tokens=draft)
        result = runner.execute(StepPlan(step_id=0, seqs=(seq,), new_requests=(NewRequest(request_id=rid, prompt_token_ids=new),) if new else ()))
        return result.sampled[rid], result.accepted.get(rid, 0)

    try:
        for prompt in ([5, 6, 7, 5, 6, 7], [9, 9, 9, 9, 9, 9], [3, 14, 15, 92, 65, 35]):
            history = list(prompt)
            token, _ = step("a", prompt, 0, new=tuple(prompt))
            for _ in range(4):  # step by step
                history.append(token)
                token, _ = step("a", [token], len(history) - 1)
            sequential = [*history[len(prompt) :], token]  # 5 tokens
            first, _ = step("b", prompt, 0, new=tuple(prompt))
            assert first == sequential[0]
            after, kept = step("b", sequential[:4], len(prompt), draft=3)  # feed t1, verify t2..t4
            assert (kept, after) == (3, sequential[4]), prompt
            runner.requests.apply(StepPlan(step_id=0, seqs=(), freed_request_ids=("a", "b")))
    finally:
        runner.close()


async def test_clients_leaving_mid_draft_free_every_block_and_runner_state(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Looping prompts keep drafts in flight; each client leaves after a few tokens (an abort
    while its draft may be in the step), beside one that runs to the end. Every KV block, the
    core's requests and the runner's states come back (one last request's plan frees the rest).
    Every request drafts all it can: on a GPU the step cost fit finds drafts of a tiny model
    not worth their verify rows, and the test drafted nothing (the GPU check's second run)."""
    always_draft(monkeypatch)
    leave_after = [3, 5, 8, 13, 21]
    received, stats, kept, drafted_before = await leave_mid_draft(tiny_config(tiny_model_dir, spec_decoding="ngram", num_kv_blocks=48), lambda i: [5, 6, 7] * 3, leave_after)
    assert len(received) == len(leave_after) and max(received) < 60  # every client left early (a delta may carry several kept draft tokens)
    assert stats["spec_draft_tokens"] > drafted_before, stats  # drafts were in flight
    assert stats["kv_blocks_used"] == 0 and stats["requests"] == 0 and stats["live_requests"] == 0, stats
    assert kept == 1  # only the last request's state: its own freeing plan has not come yet
