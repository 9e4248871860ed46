"""One request's fault fails that request only; the rest of its step stands.

Two layers: the real runner on the tiny model, given a plan in which one request's grammar
state is broken, and the whole server with sampling made to raise whenever a poisoned
request shares the batch (the batched call fails; the runner redoes its rows one by one).
"""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest
import trio

from actors.runners import torch_runner
from actors.runners.runner_config import RunnerConfig
from runtime.messages import NewRequest, ScheduledSeq, StepPlan, StepResult
from runtime.sampling import Guide, SamplingParams
from tests.support.servers import Server

pytestmark = pytest.mark.in_process  # the engine in the server's process (tests/conftest.py)

POISON_SEED = 1313


def one_greedy_step(model_dir: Path, requests: list[tuple[str, object]]) -> StepResult:
    """One real step on the tiny model: each (request id, matcher or None) prefills [5, 6, 7]
    (the plan introduces each request, handing the runner its matcher)."""
    runner = torch_runner.TorchRunner(model_dir, RunnerConfig(dtype="float32", num_kv_blocks=32, block_size=4, num_threads=1))
    runner.load()
    try:
        greedy = SamplingParams(temperature=0.0, max_tokens=4)
        seqs = tuple(
            ScheduledSeq(request_id=rid, token_ids=[5, 6, 7], start_pos=0, block_table=[2 * i], sample=True, sampling=greedy, seed=i)
            for i, (rid, _) in enumerate(requests)
        )
        new = tuple(NewRequest(request_id=rid, prompt_token_ids=(5, 6, 7), matcher=m) for rid, m in requests)
        return runner.execute(StepPlan(step_id=0, seqs=seqs, new_requests=new))
    finally:
        runner.close()


def test_a_broken_grammar_state_fails_its_request_only(tiny_model_dir: Path) -> None:
    import llguidance
    import llguidance.hf
    from transformers import AutoTokenizer

    from actors.guidance import guide_grammar

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer)
    grammar = guide_grammar(Guide(kind="json_object", param="response_format"))
    healthy = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
    broken = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
    assert not broken.consume_token(tokenizer.encode("x", add_special_tokens=False)[0])  # not JSON: error state
    assert broken.is_error()

    result = one_greedy_step(tiny_model_dir, [("plain", None), ("guided", healthy), ("broken", broken)])
    assert result.error is None
    assert set(result.sampled) == {"plain", "guided"}
    assert set(result.failed) == {"broken"} and result.failed["broken"].startswith("grammar error")
    # The healthy matcher took its token; the grammar allowed it.
    assert not healthy.is_error()
    assert tokenizer.decode([result.sampled["guided"]]).lstrip().startswith(("{", "["))


def test_a_mask_fill_that_raises_fails_the_guided_requests_only(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import llguidance
    import llguidance.hf
    import llguidance.torch
    from transformers import AutoTokenizer

    from actors.guidance import guide_grammar

    def explode(*args: object) -> None:
        raise RuntimeError("injected llguidance failure")

    monkeypatch.setattr(llguidance.torch, "fill_next_token_bitmask_par", explode)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    matcher = llguidance.LLMatcher(llguidance.hf.from_tokenizer(tokenizer), guide_grammar(Guide(kind="json_object")), log_level=0)
    result = one_greedy_step(tiny_model_dir, [("plain", None), ("guided", matcher)])
    assert result.error is None
    assert set(result.sampled) == {"plain"}
    assert "injected llguidance failure" in result.failed["guided"]


async def test_a_request_whose_sampling_raises_fails_alone(
    server: Server, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (9, 14, 21)]
    body = dict(model="tiny", max_tokens=16, temperature=0, ignore_eos=True)
    expected = [(await http.post("/v1/completions", json={**body, "prompt": p})).json()["choices"][0]["text"] for p in prompts]

    real_sample = torch_runner.sample
    shared_steps = []

    def sample(logits, batch):  # type: ignore[no-untyped-def]
        if bool((batch.seed == POISON_SEED).any()):
            shared_steps.append(len(batch.seed))
            raise RuntimeError("injected sampling fault")
        return real_sample(logits, batch)

    monkeypatch.setattr(torch_runner, "sample", sample)
    results: dict[str, httpx.Response] = {}

    async def send(name: str, payload: dict, delay: float) -> None:
        await trio.sleep(delay)
        results[name] = await http.post("/v1/completions", json=payload)

    async with trio.open_nursery() as nursery:
        for i, p in enumerate(prompts):
            nursery.start_soon(send, f"ok{i}", {**body, "prompt": p}, 0.0)
        nursery.start_soon(send, "poison", {**body, "prompt": [7, 8, 9], "temperature": 1.0, "seed": POISON_SEED}, 0.01)

    assert max(shared_steps) > 1, "precondition: the poisoned request shared a step"
    poison = results["poison"]
    assert poison.status_code == 500 and "request id" in poison.json()["error"]["message"]  # the fault's text: in the log only
    assert "injected" not in poison.json()["error"]["message"]
    for i in range(len(prompts)):
        assert results[f"ok{i}"].status_code == 200
        assert results[f"ok{i}"].json()["choices"][0]["text"] == expected[i]
    stats = server.runtime.statistics()  # type: ignore[attr-defined]
    assert stats["running"] == stats["waiting"] == stats["kv_blocks_used"] == 0


async def test_a_grammar_failure_answers_a_500_without_the_grammar_or_the_parsers_state(
    server: Server, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The matcher refuses a token it allowed (llguidance's error carries its whole state and the
    grammar, the server's private tool grammar included): the client gets the request id alone,
    in the JSON body and in the stream's error event."""
    from actors.runners import grammar_masks

    def refusing(draw, token, failed):  # type: ignore[no-untyped-def]
        failed[draw.request_id] = 'grammar error: token 198 rejected: <state>\nTokens: ⟦{"a"⟧ Flags: had_rollback</state><grammar>{"grammars": [...]}</grammar>'
        return False

    monkeypatch.setattr(grammar_masks, "consume", refusing)
    monkeypatch.setattr(torch_runner, "consume", refusing)
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 8, "response_format": {"type": "json_object"}}
    plain = await http.post("/v1/completions", json=body)
    assert plain.status_code == 500, plain.text
    async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        streamed = (await resp.aread()).decode()
    for text in (plain.text, streamed):
        assert "request id" in text and not any(word in text for word in ("grammar", "state", "Tokens", "rollback", "198")), text
