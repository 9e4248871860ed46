"""Out-of-range or contradictory generation controls: 400 with error.param naming the field.

Ranges per the Databricks Foundation Model API reference and MindIE's completions reference:
temperature [0, 2], top_p (0, 1], repetition_penalty (0, 2], presence/frequency penalty [-2, 2],
legacy logprobs [0, 5], chat top_logprobs [0, 20], n and best_of [1, 128]; best_of >= n, and
equal to n when streaming; n > 1 (or best_of > 1) needs temperature > 0; top_k -1 / null or > 0;
stop strings non-empty and 32768 characters in all (MindIE); reasoning_effort low / medium /
high (the Databricks chat request). Also use_beam_search (MindIE,
api/http/openai/completions/beam.py; its controls in test_beam_controls.py).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import torch

from tests.support.http import stream_events
from tests.support.reference import Reference
from tests.support.servers import Server
from tests.support.waiting import in_thread

COMPLETION = {"model": "tiny", "prompt": "The quick brown", "max_tokens": 2}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

CASES: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/completions", {"n": 3, "best_of": 2}, "best_of"),
    ("/v1/completions", {"n": 2, "best_of": 3, "stream": True}, "best_of"),
    ("/v1/completions", {"best_of": 2, "stream": True}, "best_of"),
    ("/v1/completions", {"n": 2, "temperature": 0}, "temperature"),
    ("/v1/completions", {"best_of": 2, "temperature": 0}, "temperature"),
    ("/v1/completions", {"logprobs": 6}, "logprobs"),
    ("/v1/completions", {"logprobs": -1}, "logprobs"),
    ("/v1/completions", {"best_of": 129}, "best_of"),
    ("/v1/completions", {"n": 129}, "n"),
    ("/v1/completions", {"temperature": 2.01}, "temperature"),
    ("/v1/completions", {"top_p": 0}, "top_p"),
    ("/v1/completions", {"top_p": 1.5}, "top_p"),
    ("/v1/completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/completions", {"repetition_penalty": 2.5}, "repetition_penalty"),
    ("/v1/completions", {"presence_penalty": 2.5}, "presence_penalty"),
    ("/v1/completions", {"frequency_penalty": -2.5}, "frequency_penalty"),
    ("/v1/completions", {"error_behavior": "ignore"}, "error_behavior"),
    ("/v1/completions", {"stop_token_ids": [-1]}, "stop_token_ids[0]"),
    ("/v1/completions", {"stop": ""}, "stop"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"n": 2, "temperature": 0}, "temperature"),
    ("/v1/chat/completions", {"temperature": 3}, "temperature"),
    ("/v1/chat/completions", {"top_p": 0}, "top_p"),
    ("/v1/chat/completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/chat/completions", {"presence_penalty": 2.5}, "presence_penalty"),
    # top_k: -1 / null (off) or > 0 (Databricks and MindIE references); 0 is neither.
    ("/v1/completions", {"top_k": 0}, "top_k"),
    ("/v1/chat/completions", {"top_k": 0}, "top_k"),
    # stop (MindIE completions): each string non-empty, at most 32768 characters in all.
    ("/v1/completions", {"stop": "x" * 32769}, "stop"),
    ("/v1/completions", {"stop": ["a" * 20000, "b" * 12769]}, "stop"),
    ("/v1/chat/completions", {"stop": ["a", ""]}, "stop"),
    # reasoning_effort (the Databricks chat request): "low", "medium" or "high"; also "none" and
    # "minimal" (OpenAI's values for reasoning models).
    ("/v1/chat/completions", {"reasoning_effort": "extreme"}, "reasoning_effort"),
    # The output budget past the context is named as the client sent it.
    ("/v1/chat/completions", {"max_tokens": None, "max_completion_tokens": 100000}, "max_completion_tokens"),
    ("/v1/chat/completions", {"max_tokens": 100000}, "max_tokens"),
]


async def test_invalid_controls_get_400_naming_the_field(server: Server, http: httpx.AsyncClient) -> None:
    """All cases against one server (a server per case would dominate the run time)."""
    wrong = []
    for path, fields, param in CASES:
        base = COMPLETION if path == "/v1/completions" else CHAT
        r = await http.post(path, json={**base, **fields})
        body = r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text
        error = body.get("error") if isinstance(body, dict) else None
        if r.status_code != 400 or not error or error.get("param") != param or error.get("type") != "invalid_request_error":
            wrong.append((path, fields, param, r.status_code, body))
    assert not wrong, "\n".join(map(repr, wrong))
    # The engine is fine afterwards.
    r = await http.post("/v1/completions", json={**COMPLETION, "temperature": 0})
    assert r.status_code == 200


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 2.0, "top_p": 1.0, "repetition_penalty": 2.0, "presence_penalty": -2.0, "frequency_penalty": 2.0},
        {"n": 2, "best_of": 2, "stream": True},  # streaming with best_of == n is allowed
        {"logprobs": 5, "echo": True},
        {"top_k": -1, "seed": 2**63 - 1},
        {"seed": 2**64 - 1},  # MindIE completions: uint64, (0, 18446744073709551615]
        {"top_k": 10**6},  # MindIE completions: a top_k past the vocabulary means the whole vocabulary
        {"top_k": 1, "n": 2},  # greedy through top_k is allowed with n > 1
        {"stop": [chr(65 + i % 26) * 2 for i in range(40)]},  # no reference limits how many stops
        {"stop": "x" * 32768},  # MindIE completions: up to 32768 characters
        {"stop": ["a" * 16384, "b" * 16384]},
    ],
    ids=[
        "range-edges", "stream-best_of-eq-n", "logprobs-5-echo", "top_k-off-seed-int64-max", "seed-uint64-max",
        "top_k-past-vocab", "n2-top_k1", "stop-40-strings", "stop-32768-chars", "stop-list-32768-chars",
    ],
)
async def test_boundary_values_are_accepted(server: Server, http: httpx.AsyncClient, fields: dict[str, Any]) -> None:
    r = await http.post("/v1/completions", json={**COMPLETION, **fields})
    assert r.status_code == 200, r.text


async def test_use_beam_search(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    """MindIE completions: beam width max(best_of, n), n beams returned best first; not with stop; a
    stream is one chunk holding every beam. The beams equal transformers' beam search."""
    prompt = [5, 17, 42, 99, 7, 63, 12]
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 6, "ignore_eos": True, "use_beam_search": True, "n": 2, "best_of": 3}

    def hf_beams() -> list[list[int]]:
        x = torch.tensor([prompt])
        out = ref.model.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=6, num_beams=3, num_return_sequences=3,
            do_sample=False, early_stopping=False, length_penalty=1.0, eos_token_id=None, pad_token_id=0,
        )
        return [seq[len(prompt) :].tolist() for seq in out]

    expected = await in_thread(hf_beams)
    r = await http.post("/v1/completions", json={**body, "logprobs": 0})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert [c["text"] for c in out["choices"]] == [ref.decode(b) for b in expected[:2]]
    sums = [sum(c["logprobs"]["token_logprobs"]) for c in out["choices"]]
    assert sums == sorted(sums, reverse=True)
    assert out["usage"]["completion_tokens"] == 2 * 6

    events = await stream_events(http, "/v1/completions", **{k: v for k, v in body.items() if k != "model"})
    assert len(events) == 1
    assert [c["text"] for c in events[0]["choices"]] == [ref.decode(b) for b in expected[:2]]

    # MindIE completions: beam search does not take stop. (Every other control: test_beam_controls.py.)
    r = await http.post("/v1/completions", json={**body, "stop": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop", r.text
