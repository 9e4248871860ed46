"""Message and seed rules of the public references, refused naming the field on every surface
that has them.

- The Databricks Foundation Model API's chat request: the system role "may be used only once,
  as the first message"; a `tool` message carries the `tool_call_id` of the call it answers.
  Chat is one logic behind three surfaces (OpenAI /v1/chat/completions, Databricks invocations, Azure ML
  /chat/completions), so each refuses these in its own error shape: OpenAI 400 with
  error.param, Databricks 400 INVALID_PARAMETER_VALUE naming the field, Azure 422 with a
  detail entry whose loc is the field.
- MindIE completions: `seed` is a uint64 in (0, 18446744073709551615]; 0, negative
  values and 2**64 are refused with param "seed", on /v1/completions and on Databricks
  invocations with a completions body. (Chat's seed stays OpenAI's int64: no reference bounds it.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.servers import Server, platform_client, platform_server
from tests.support.waiting import in_thread

SYSTEM, USER, ASSISTANT = {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}
CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}

# (messages, the field named)
BAD_MESSAGES: list[tuple[list[dict[str, Any]], str]] = [
    ([USER, SYSTEM], "messages[1].role"),  # not the first
    ([SYSTEM, USER, SYSTEM, USER], "messages[2].role"),  # twice
    ([SYSTEM, {"role": "developer", "content": "x"}, USER], "messages[1].role"),  # the same prompt, twice
    ([USER, CALL, {"role": "tool", "content": "42"}], "messages[2].tool_call_id"),
    ([USER, CALL, {"role": "tool", "content": "42", "tool_call_id": ""}], "messages[2].tool_call_id"),
]
GOOD_MESSAGES = [[SYSTEM, USER], [USER, ASSISTANT, USER], [SYSTEM, USER, CALL, {"role": "tool", "content": "42", "tool_call_id": "call_1"}]]
BAD_SEEDS = [0, -1, -(2**63), 2**64]
GOOD_SEEDS = [1, 2**63, 2**64 - 1]


@pytest.mark.parametrize(("messages", "param"), BAD_MESSAGES)
async def test_openai_chat_refuses_misplaced_roles(client: openai.OpenAI, messages: list, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await in_thread(client.chat.completions.create, model="tiny", messages=messages, max_tokens=2)
    assert info.value.status_code == 400 and info.value.body["param"] == param, info.value.body  # type: ignore[index]


async def test_openai_chat_accepts_well_placed_roles(client: openai.OpenAI) -> None:
    for messages in GOOD_MESSAGES:
        out = await in_thread(client.chat.completions.create, model="tiny", messages=messages, max_tokens=2, temperature=0)  # greedy: a sampled token could be the end of turn (flaked in CI)
        assert out.choices[0].finish_reason == "length"


async def test_completions_seed_range(server: Server, client: openai.OpenAI) -> None:
    for seed in BAD_SEEDS:
        with pytest.raises(openai.BadRequestError) as info:
            await in_thread(client.completions.create, model="tiny", prompt="The", max_tokens=2, seed=seed)
        assert info.value.body["param"] == "seed" and "(0, 18446744073709551615]" in info.value.body["message"], (seed, info.value.body)  # type: ignore[index]
    for seed in GOOD_SEEDS:
        out = await in_thread(client.completions.create, model="tiny", prompt="The", max_tokens=2, temperature=1.0, seed=seed)
        assert len(out.choices) == 1
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:  # beam search checks it too
        r = await http.post("/v1/completions", json={"model": "tiny", "prompt": "The", "max_tokens": 2, "use_beam_search": True, "best_of": 2, "seed": 0})
        assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text


async def test_databricks_and_azure_refuse_in_their_shapes(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path) as srv, platform_client(srv) as http:
        for messages, param in BAD_MESSAGES:
            body = {"messages": messages, "max_tokens": 2}
            r = await http.post("/serving-endpoints/tiny/invocations", json=body)
            assert r.status_code == 400 and r.json()["error_code"] == "INVALID_PARAMETER_VALUE" and param in r.json()["message"], r.text
            r = await http.post("/chat/completions?api-version=2024-05-01-preview", json=body)
            assert r.status_code == 422 and r.headers["x-ms-error-code"] == "UnprocessableContent", r.text
            assert r.json()["detail"][0]["loc"] == ["body", *param.replace("[", ".").replace("]", "").split(".")], r.text
        for seed in BAD_SEEDS:
            r = await http.post("/serving-endpoints/tiny/invocations", json={"prompt": "The", "max_tokens": 2, "seed": seed})
            assert r.status_code == 400 and r.json()["error_code"] == "INVALID_PARAMETER_VALUE" and "seed" in r.json()["message"], r.text
        r = await http.post("/serving-endpoints/tiny/invocations", json={"messages": GOOD_MESSAGES[2], "max_tokens": 2})
        assert r.status_code == 200, r.text
