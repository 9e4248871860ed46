"""use_beam_search with every other control (MindIE completions; api/http/openai/completions/beam.py, api/http/openai/completions/params.py `_beam_params`).

Beam search goes through the same validation as sampling, then honours stop_token_ids (a beam
ends on one, stop_reason says which), the three penalties (applied to each round's log-probs,
as transformers' beam search applies its processors), error_behavior "truncate", echo,
`logprobs: k` (k alternatives per token), max_tokens defaulting to the rest of the context, and
MindIE's per-token usage lists. What it cannot honour (stop, top_p / top_k, and what sampling
rejects too) is a 400 naming the field. The oracle is transformers' generate(num_beams=k), or,
for presence / frequency (which transformers lacks), the same search over the full vocabulary.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.support.http import complete, stream_events
from tests.support.reference import TOL, Reference
from tests.support.servers import Server
from tests.support.waiting import in_thread

PROMPT = [5, 17, 42, 99, 7, 63, 12]
BEAM = {"use_beam_search": True, "ignore_eos": True}


def hf_beams(ref: Reference, prompt: list[int], width: int, steps: int, eos: list[int] | None = None, **kw: Any) -> list[list[int]]:
    """transformers' beam search; each beam cut after its first `eos` token."""
    x = torch.tensor([prompt])
    with torch.inference_mode():
        out = ref.model.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=steps, num_beams=width, num_return_sequences=width,
            do_sample=False, early_stopping=False, length_penalty=1.0, eos_token_id=eos, pad_token_id=0, **kw,
        )
    beams = []
    for seq in out:
        tokens = seq[len(prompt) :].tolist()
        ends = [i for i, t in enumerate(tokens) if t in (eos or [])]
        beams.append(tokens[: ends[0] + 1] if ends else tokens)
    return beams


def full_vocab_beams(ref: Reference, prompt: list[int], width: int, steps: int, presence: float = 0.0, frequency: float = 0.0) -> list[list[int]]:
    """The same search (no EOS), scoring every token of the vocabulary each round: the round's
    log-probs minus presence * [count > 0] + frequency * count over the beam's tokens."""
    beams: list[tuple[list[int], float]] = [([], 0.0)]
    for _ in range(steps):
        candidates = []
        for b, (tokens, score) in enumerate(beams):
            row = ref.logprobs(prompt + tokens)[-1]
            counts = torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=row.shape[0]).float()
            row = row - presence * (counts > 0).float() - frequency * counts
            candidates += [(score + float(v), b, t) for t, v in enumerate(row.tolist())]
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
        beams = [(beams[b][0] + [t], s) for s, b, t in candidates[:width]]
    return [tokens for tokens, _ in beams]


async def test_stop_token_ids_end_a_beam(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    plain = await in_thread(hf_beams, ref, PROMPT, 3, 8)

    def pick() -> tuple[int, list[list[int]]]:
        """A token of the plain beams that, as a stop token, ends one of the returned beams."""
        for stop in sorted({t for b in plain for t in b}):
            expected = hf_beams(ref, PROMPT, 3, 8, eos=[stop])
            if any(b[-1] == stop for b in expected) and expected != plain:
                return stop, expected
        raise AssertionError("no usable stop token")

    stop, expected = await in_thread(pick)
    body = {**BEAM, "prompt": PROMPT, "n": 3, "max_tokens": 8, "stop_token_ids": [stop]}
    out = await complete(http, **body)
    assert [c["text"] for c in out["choices"]] == [ref.decode(b[:-1] if b[-1] == stop else b) for b in expected]
    for c, b in zip(out["choices"], expected):
        ended = b[-1] == stop
        assert (c["finish_reason"], c["stop_reason"]) == (("stop", stop) if ended else ("length", None)), c
    assert out["usage"]["completion_tokens"] == sum(len(b) for b in expected)

    kept = await complete(http, **body, include_stop_str_in_output=True, skip_special_tokens=False)
    assert [c["text"] for c in kept["choices"]] == [ref.decode(b, skip_special_tokens=False) for b in expected]

    # EOS ends a beam unless ignore_eos; stop_reason stays null for it.
    eos_out = await complete(http, **{**body, "ignore_eos": False, "stop_token_ids": None, "logprobs": 0})
    expected_eos = await in_thread(hf_beams, ref, PROMPT, 3, 8, eos=[ref.eos])
    assert [len(c["logprobs"]["tokens"]) for c in eos_out["choices"]] == [len(b) for b in expected_eos]
    assert all(c["stop_reason"] is None for c in eos_out["choices"])


@pytest.mark.parametrize(
    ("field", "value"),
    [("repetition_penalty", 2.0), ("repetition_penalty", 0.7), ("presence_penalty", 2.0), ("frequency_penalty", 1.0), ("presence_penalty", -1.0)],
)
async def test_penalties_apply_to_each_rounds_scores(server: Server, http: httpx.AsyncClient, ref: Reference, field: str, value: float) -> None:
    """"hello there" makes the tiny model repeat itself, so each penalty changes the beams."""
    prompt = ref.encode("hello there")
    width, steps = 2, 10
    plain = await in_thread(hf_beams, ref, prompt, width, steps)
    if field == "repetition_penalty":
        expected = await in_thread(hf_beams, ref, prompt, width, steps, repetition_penalty=value)
    else:
        expected = await in_thread(full_vocab_beams, ref, prompt, width, steps, **{field.split("_")[0]: value})
        assert await in_thread(full_vocab_beams, ref, prompt, width, steps) == plain  # the oracle is transformers' search
    assert expected != plain
    out = await complete(http, **BEAM, prompt=prompt, n=width, max_tokens=steps, **{field: value})
    assert [c["text"] for c in out["choices"]] == [ref.decode(b) for b in expected]
    assert [ref.decode(b) for b in expected] != [ref.decode(b) for b in plain]


async def test_truncate_keeps_the_prompt_tail(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    rng = random.Random(3)
    prompt = [rng.randrange(3, 300) for _ in range(520)]  # past the 512-token context
    r = await http.post("/v1/completions", json={"model": "tiny", **BEAM, "prompt": prompt, "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    out = await complete(http, **BEAM, prompt=prompt, n=2, max_tokens=4, error_behavior="truncate", echo=True)
    kept = prompt[-(512 - 4) :]
    assert out["usage"]["prompt_tokens"] == len(kept)
    assert out["usage"]["truncated_prompt_tokens"] == len(prompt) - len(kept)
    expected = await in_thread(hf_beams, ref, kept, 2, 4)
    assert [c["text"] for c in out["choices"]] == [ref.decode(kept) + ref.decode(b) for b in expected]


async def test_max_tokens_defaults_to_the_rest_of_the_context(server: Server, http: httpx.AsyncClient) -> None:
    rng = random.Random(4)
    prompt = [rng.randrange(3, 300) for _ in range(505)]
    out = await complete(http, **BEAM, prompt=prompt)
    assert out["usage"]["completion_tokens"] == 512 - 505
    assert out["choices"][0]["finish_reason"] == "length"
    r = await http.post("/v1/completions", json={"model": "tiny", **BEAM, "prompt": prompt, "max_tokens": 8})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


async def test_usage_lists_per_generated_token(server: Server, http: httpx.AsyncClient) -> None:
    """MindIE's streaming example is a beam request (n = best_of = 2, max_tokens 5): one
    chunk with both beams and usage.batch_size / queue_wait_time, one entry per token."""
    body = {**BEAM, "prompt": PROMPT, "n": 2, "best_of": 2, "max_tokens": 5, "temperature": 1, "logprobs": 2}
    for usage in [(await complete(http, **body))["usage"], (await stream_events(http, "/v1/completions", **body))[0]["usage"]]:
        assert usage["completion_tokens"] == 10
        assert len(usage["batch_size"]) == len(usage["queue_wait_time"]) == 10
        assert all(isinstance(b, int) and b >= 1 for b in usage["batch_size"])
        assert all(isinstance(w, int) and w >= 0 for w in usage["queue_wait_time"])
        # Each beam's first token came from the one first-round step, alone in its batch.
        assert usage["batch_size"][0] == usage["batch_size"][5] == 1
    events = await stream_events(http, "/v1/completions", **body)
    assert len(events) == 1 and len(events[0]["choices"]) == 2


async def test_logprobs_k_lists_k_alternatives(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    """Width 1 used to ask the engine for 2 alternatives per round, whatever k was."""
    out = await complete(http, **BEAM, prompt=PROMPT, max_tokens=3, logprobs=5)
    got = out["choices"][0]["logprobs"]
    tokens = await in_thread(hf_beams, ref, PROMPT, 1, 3)
    lp = await in_thread(ref.logprobs, PROMPT + tokens[0])
    for j, token in enumerate(tokens[0]):
        row = lp[len(PROMPT) + j - 1]
        values, ids = row.topk(5)
        expected: dict[str, float] = {}
        for t, v in zip(ids.tolist(), values.tolist()):
            expected.setdefault(ref.token_text(t), v)
        expected.setdefault(ref.token_text(token), float(row[token]))
        assert got["top_logprobs"][j].keys() == expected.keys(), j
        assert list(got["top_logprobs"][j].values()) == pytest.approx(list(expected.values()), abs=TOL)
        assert got["token_logprobs"][j] == pytest.approx(float(row[token]), abs=TOL)


async def test_echo_returns_the_prompt_with_its_logprobs(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    text = "The quick brown"
    ids = ref.encode(text)
    out = await complete(http, **BEAM, prompt=text, n=2, max_tokens=4, echo=True, logprobs=1, suffix="!")
    expected = await in_thread(hf_beams, ref, ids, 2, 4)
    lp = await in_thread(ref.logprobs, ids)
    for c, beam in zip(out["choices"], expected):
        assert c["text"] == text + ref.decode(beam) + "!"
        got = c["logprobs"]
        assert got["token_logprobs"][0] is None and len(got["tokens"]) == len(ids) + 4
        for p in range(1, len(ids)):
            assert got["token_logprobs"][p] == pytest.approx(float(lp[p - 1, ids[p]]), abs=TOL)
        assert got["text_offset"][len(ids)] == len(text)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stop": "x"}, "stop"),
        ({"min_tokens": 2}, "min_tokens"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 5}, "top_k"),
        ({"top_p": 0.5}, "top_p"),
        ({"seed": 2**64}, "seed"),
        ({"stop": "y" * 40000}, "stop"),
    ],
)
async def test_what_beam_search_cannot_honour_is_a_400(server: Server, http: httpx.AsyncClient, fields: dict[str, Any], param: str) -> None:
    r = await http.post("/v1/completions", json={"model": "tiny", **BEAM, "prompt": PROMPT, "max_tokens": 2, **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


async def test_beam_search_needs_no_temperature(server: Server, http: httpx.AsyncClient) -> None:
    """n > 1 needs temperature > 0 only when sampling; top_k -1 and top_p 1 (off) are fine."""
    for fields in ({"temperature": 0}, {"temperature": 1.0, "seed": 5, "top_k": -1, "top_p": 1.0}):
        out = await complete(http, **BEAM, prompt=PROMPT, n=2, max_tokens=2, **fields)
        assert len(out["choices"]) == 2


async def test_beam_errors_keep_the_databricks_shape(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A beam search's error is raised inside task groups; the Databricks surface (which maps a
    ServingError itself) must still get it, not an exception group."""
    from tests.support.servers import platform_client, platform_server

    async with platform_server(tiny_model_dir, monkeypatch, tmp_path) as srv, platform_client(srv) as http:
        body = {**BEAM, "prompt": [PROMPT * 80, PROMPT], "max_tokens": 2}
        r = await http.post("/serving-endpoints/tiny/invocations", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error_code"] and "prompt" in r.json()["message"], r.text
