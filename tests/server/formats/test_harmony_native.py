"""gpt-oss's harmony format served by a real model: a native Llama-shaped tiny model (gpt-oss's own
attention, with sinks, is refused at start until it is served right) with gpt-oss's tokenizer
and real chat template, trained in-process (tests/support/trained_model.py) to write what the
scripted gpt-oss of test_families.py writes for each prompt the server renders: its analysis,
then the call on the commentary channel; the final answer once the result is in; a plain answer
when shown no tools. The same client conversation runs first against the scripted model (which
yields the prompts and answers to train on), then against the trained one on the CPU's default
path (bf16, the row-invariant kernels): every answer the same, through the `openai` SDK, Chat
whole and streamed, auto and forced, the reasoning, the second turn, and Responses' items.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import trio

from tests.support.families import ANSWER, ASK, FAMILIES, NO_TOOLS, RESPONSES_WEATHER, WEATHER, answer_for, family_tokenizer
from tests.support.scripted_runner import scripted_engine
from tests.support.servers import start_runtime_server, start_server, tiny_config
from tests.support.trained_model import build_trained_llama
from tests.support.waiting import in_thread


def conversation(client: openai.OpenAI, model: str) -> dict[str, Any]:
    """What a client of gpt-oss sees across one tool conversation, in plain values."""

    def chat(**kwargs: Any) -> Any:
        return client.chat.completions.create(model=model, max_tokens=120, temperature=0, messages=ASK, **kwargs)

    def call(completion: Any) -> tuple[Any, ...]:
        choice = completion.choices[0]
        return choice.finish_reason, [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or ()], choice.message.content

    seen: dict[str, Any] = {}
    whole = chat(tools=[WEATHER])
    seen["auto"] = call(whole), whole.choices[0].message.model_extra.get("reasoning")
    with client.chat.completions.stream(model=model, max_tokens=120, temperature=0, messages=ASK, tools=[WEATHER]) as stream:
        seen["streamed"] = call(stream.get_final_completion())
    seen["named"] = call(chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    seen["required"] = call(chat(tools=[WEATHER], tool_choice="required"))
    seen["none"] = call(chat(tools=[WEATHER], tool_choice="none"))
    (first,) = whole.choices[0].message.tool_calls
    turn = [*ASK, {"role": "assistant", "content": None, "tool_calls": [first.model_dump()]}, {"role": "tool", "tool_call_id": first.id, "content": '{"temp": 21}'}]
    seen["second turn"] = call(client.chat.completions.create(model=model, max_tokens=120, temperature=0, messages=turn, tools=[WEATHER]))
    with client.responses.stream(model=model, max_output_tokens=120, temperature=0, input=ASK[0]["content"], tools=[RESPONSES_WEATHER]) as stream:
        response = stream.get_final_response()
    seen["responses"] = [(item.type, getattr(item, "name", None), getattr(item, "arguments", None)) for item in response.output]
    return seen


async def test_a_trained_llama_shaped_model_writes_harmony_through_the_server(tmp_path: Path) -> None:
    family = FAMILIES["gpt-oss"]
    tokenizer = await trio.to_thread.run_sync(family_tokenizer, "gpt-oss")
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|return|>", "<|call|>")]
    scripted = scripted_engine(tokenizer, answer_for(family), eos)
    async with trio.open_nursery() as nursery:
        server = await start_runtime_server(nursery, scripted)
        with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=60) as client:
            expected = await in_thread(conversation, client, "family")
        server.stop.set()
    examples = list({tuple(p): (p, a) for p, a in scripted.runner.examples}.values())
    model_dir = await trio.to_thread.run_sync(lambda: build_trained_llama(tmp_path / "gpt-oss-shaped", tokenizer, examples, eos))
    config = tiny_config(model_dir, served_name="family", dtype="bfloat16", num_kv_blocks=512, block_size=16, max_num_batched_tokens=512)
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery, config)
        engine: Any = server.runtime
        assert engine.tool_format == "openai" and engine.info.impl.startswith("native"), engine.info.impl
        with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=60) as client:
            seen = await in_thread(conversation, client, "family")
        server.stop.set()
    assert seen == expected
    assert seen["auto"] == (("tool_calls", [("get_weather", {"city": "Paris"})], None), "The user wants the weather.")
    assert seen["second turn"] == ("stop", [], ANSWER) and seen["none"] == ("stop", [], NO_TOOLS)
    assert [kind for kind, _, _ in seen["responses"]] == ["reasoning", "function_call"], seen["responses"]
