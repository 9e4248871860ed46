"""frequency_penalty, presence_penalty, repetition_penalty (MindIE completions' ranges; vLLM definitions).

- frequency: logit -= f * (times the token occurs in the OUTPUT so far)
- presence:  logit -= p * (1 if it occurs in the output so far)
- repetition (CTRL / transformers): for tokens seen in the PROMPT or output, a positive
  logit is divided by r and a negative one multiplied by r.

"hello there" greedily degenerates into one token repeated forever on the tiny model; each
penalty must break that loop, and the whole penalized greedy continuation must equal the one
computed here from the raw logits. The exact first-token checks use stop_token_ids to read
the chosen token id back: generation ends at once with stop_reason == that id.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
import torch
import trio

from tests.support.http import complete
from tests.support.reference import Reference
from tests.support.servers import Server
from tests.support.waiting import in_thread

HELLO = "hello there"
STEPS = 12


def _counts(history: list[int], num_prompt: int, vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(history[num_prompt:], dtype=torch.long), minlength=vocab).float()


def frequency(f: float) -> Callable[[torch.Tensor, list[int], int], torch.Tensor]:
    return lambda row, history, num_prompt: row - f * _counts(history, num_prompt, row.shape[0])


def presence(p: float) -> Callable[[torch.Tensor, list[int], int], torch.Tensor]:
    return lambda row, history, num_prompt: row - p * (_counts(history, num_prompt, row.shape[0]) > 0).float()


def repetition(r: float) -> Callable[[torch.Tensor, list[int], int], torch.Tensor]:
    def apply(row: torch.Tensor, history: list[int], num_prompt: int) -> torch.Tensor:
        seen = torch.zeros_like(row, dtype=torch.bool)
        seen[torch.tensor(history)] = True
        return torch.where(seen, torch.where(row > 0, row / r, row * r), row)

    return apply


PENALTIES = {
    "frequency_penalty": frequency,
    "presence_penalty": presence,
    "repetition_penalty": repetition,
}


@pytest.mark.parametrize(("field", "value"), [("frequency_penalty", 2.0), ("presence_penalty", 2.0), ("repetition_penalty", 2.0)])
async def test_penalty_breaks_a_greedy_loop_exactly_as_defined(
    server: Server, http: httpx.AsyncClient, ref: Reference, field: str, value: float
) -> None:
    prompt = ref.encode(HELLO)
    plain = await in_thread(ref.greedy, prompt, STEPS)
    looped = max(set(plain), key=plain.count)
    assert plain.count(looped) >= STEPS // 2, f"precondition: {HELLO!r} no longer loops greedily: {plain}"
    expected = await in_thread(ref.greedy, prompt, STEPS, PENALTIES[field](value))
    assert expected.count(looped) < plain.count(looped) // 2  # the penalty matters here

    base = await complete(http, prompt=prompt, max_tokens=STEPS, temperature=0, ignore_eos=True)
    assert base["choices"][0]["text"] == ref.decode(plain)
    out = await complete(http, prompt=prompt, max_tokens=STEPS, temperature=0, ignore_eos=True, **{field: value})
    assert out["choices"][0]["text"] == ref.decode(expected), (field, expected)


async def _first_token_is(http: httpx.AsyncClient, prompt: list[int], token: int, **penalty: float) -> dict:
    out = await complete(http, prompt=prompt, max_tokens=4, temperature=0, ignore_eos=True, stop_token_ids=[token], **penalty)
    return out


@pytest.mark.parametrize("r", [0.5, 1.3, 2.0])
async def test_repetition_penalty_first_token_is_the_penalized_argmax(server: Server, http: httpx.AsyncClient, ref: Reference, r: float) -> None:
    """A prompt that already holds the loop: the first generated token is computed exactly."""
    start = ref.encode(HELLO)
    prompt = start + await in_thread(ref.greedy, start, 8)  # ends inside the repetition
    raw = (await in_thread(ref.logits, prompt))[-1]
    plain = int(raw.argmax())
    expected = int(repetition(r)(raw, prompt, len(prompt)).argmax())
    out = await _first_token_is(http, prompt, expected, repetition_penalty=r)
    assert out["choices"][0]["stop_reason"] == expected, (r, plain, expected, out["choices"][0])
    assert out["usage"]["completion_tokens"] == 1
    if r == 2.0:
        assert expected != plain, "precondition: the penalty must change the argmax for this prompt"


async def test_frequency_and_presence_ignore_prompt_tokens(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    """They count generated tokens only (OpenAI / vLLM): the first token after a prompt full of
    repetitions is the unpenalized argmax, while repetition_penalty (which covers the prompt)
    changes it."""
    start = ref.encode(HELLO)
    prompt = start + await in_thread(ref.greedy, start, 8)
    raw = (await in_thread(ref.logits, prompt))[-1]
    plain = int(raw.argmax())
    assert plain in prompt[len(start) :]
    for field in ("frequency_penalty", "presence_penalty"):
        out = await _first_token_is(http, prompt, plain, **{field: 2.0})
        assert out["choices"][0]["stop_reason"] == plain, field
        assert out["usage"]["completion_tokens"] == 1, field


async def test_negative_penalties_encourage_repetition(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    """MindIE completions: values below 0 (below 1.0 for repetition) reward repetition."""
    prompt = ref.encode("The quick brown")
    for field, value, penalty in (
        ("frequency_penalty", -2.0, frequency(-2.0)),
        ("presence_penalty", -2.0, presence(-2.0)),
        ("repetition_penalty", 0.5, repetition(0.5)),
    ):
        expected = await in_thread(ref.greedy, prompt, STEPS, penalty)
        out = await complete(http, prompt=prompt, max_tokens=STEPS, temperature=0, ignore_eos=True, **{field: value})
        assert out["choices"][0]["text"] == ref.decode(expected), field
        assert len(set(expected)) < STEPS // 2, (field, expected)  # it does repeat


async def test_penalties_apply_when_sampling_too(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    """Sampling draws from the penalized distribution: with a top_k of 1 (greedy through the
    sampling path, temperature 1) the loop breaks the same way as at temperature 0."""
    prompt = ref.encode(HELLO)
    expected = await in_thread(ref.greedy, prompt, STEPS, frequency(2.0))
    out = await complete(http, prompt=prompt, max_tokens=STEPS, temperature=1.0, top_k=1, seed=5, ignore_eos=True, frequency_penalty=2.0)
    assert out["choices"][0]["text"] == ref.decode(expected)
    # Penalties are per row: concurrent requests with and without one share steps unharmed.
    plain = await in_thread(ref.greedy, prompt, STEPS)
    texts: dict[int, str] = {}

    async def one(i: int) -> None:
        penalty = {"frequency_penalty": 2.0} if i % 2 else {}
        body = await complete(http, prompt=prompt, max_tokens=STEPS, temperature=0, ignore_eos=True, **penalty)
        texts[i] = body["choices"][0]["text"]

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(one, i)
    assert texts == {0: ref.decode(plain), 1: ref.decode(expected), 2: ref.decode(plain), 3: ref.decode(expected)}
