"""The serve-ray ingress's routing hashes (api/cluster/ingress.py, PromptHasher) are the chain
the replica's prefix cache computes for the same request, for a request with tools too.

The replica side is real: the whole single-node stack on its trio thread (api/cluster/host.py,
what a replica runs), serving the request; its block manager's cached hashes are then read.
Both kinds of chat template: one that renders `tools` itself (the tools go in as a template
kwarg) and one that does not (the tools become a system block). Before the ingress built the
replica's own Prompt, it rendered the bare messages, whose chain leaves the cache's at the
first block the tools change: the control below. No Ray.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from api.cluster.ingress import PromptHasher
from runtime.prefix_hash import block_hashes
from tests.support.servers import serve_once, tiny_config

pytestmark = pytest.mark.in_process  # the engine in the server's process (tests/conftest.py)

SCHEMA = {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["unit"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": SCHEMA}}
MESSAGES = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "What is the weather in Paris today?"}]
# The tiny template, plus the tools as a system turn of its own, rendered by the template.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(params=["template renders tools", "tools as a system block"])
def model_dir(request: pytest.FixtureRequest, long_model_dir: Path, tmp_path: Path) -> Path:
    if request.param == "tools as a system block":
        return long_model_dir
    copy = Path(shutil.copytree(long_model_dir, tmp_path / "tools-template"))
    (copy / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    return copy


@pytest.mark.parametrize("tool_choice", ["auto", {"type": "function", "function": {"name": "get_weather"}}])
def test_routing_hash_of_a_tool_request_is_the_replica_cache_chain(model_dir: Path, tmp_path: Path, tool_choice: Any) -> None:
    config = tiny_config(model_dir, max_num_batched_tokens=512)
    body = {"model": "tiny", "messages": MESSAGES, "tools": [TOOL], "tool_choice": tool_choice, "max_tokens": 2, "chat_template_kwargs": {"unused_flag": True}}
    hashes = PromptHasher([config]).hashes(body)
    answer, cached = serve_once(config, tmp_path, "/v1/chat/completions", body)
    prompt_blocks = answer["usage"]["prompt_tokens"] // config.block_size
    assert len(hashes) == prompt_blocks > 8  # every full block of the prompt, the tools' included
    assert set(hashes) <= cached

    # The control: the bare messages, as the ingress rendered them before.
    tokenizer = PromptHasher([config])._default.tokenizer  # type: ignore[union-attr]
    bare = tokenizer.encode(tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
    assert block_hashes(bare, config.block_size)[-1] not in cached


def test_request_struct_keeps_only_openai_fields() -> None:
    """An Azure body's extra fields (the replica checks them) do not stop the hashing."""
    from api.cluster.ingress import request_prompt
    from api.http.openai.tools.formats import plain

    found = request_prompt({"messages": MESSAGES, "tools": [TOOL], "extra_azure_field": 1}, plain(template_tools=True))
    assert found is not None and found[0].chat_template_kwargs["tools"][0]["function"]["name"] == "get_weather"
    assert request_prompt({"input": "a Responses body"}, None) is None


RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "parameters": SCHEMA}
RESPONSES_INPUT = [
    {"role": "user", "content": [{"type": "input_text", "text": "What is the weather in Paris today?"}]},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"unit": "c"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "18 C and sunny"},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.mark.parametrize("input_", [RESPONSES_INPUT, "What is the weather in Paris today?"], ids=["items", "string"])
def test_routing_hash_of_a_responses_request_is_the_replica_cache_chain(model_dir: Path, tmp_path: Path, input_: Any) -> None:
    """/v1/responses: `input` (a string or items, tool calls and their outputs included),
    `instructions` and `tools` become the replica's prompt as the Responses route builds it."""
    config = tiny_config(model_dir, max_num_batched_tokens=512)
    body = {"model": "tiny", "input": input_, "instructions": "You answer briefly.", "tools": [RESPONSES_TOOL], "max_output_tokens": 2}
    hashes = PromptHasher([config]).hashes(body, responses=True)
    answer, cached = serve_once(config, tmp_path, "/v1/responses", body)
    assert answer["object"] == "response", answer
    assert len(hashes) == answer["usage"]["input_tokens"] // config.block_size > 8
    assert set(hashes) <= cached
    # The ingress takes a body for a Responses one by its route: an embeddings body has `input` too.
    hasher, raw = PromptHasher([config]), json.dumps(body).encode()
    hint = hasher.hint({"method": "POST", "path": "/v1/responses", "headers": []}, raw)
    assert hint is not None and hint.block_hashes == hashes
    assert hasher.hint({"method": "POST", "path": "/v1/embeddings", "headers": []}, raw) is None


def test_a_reasoning_models_prompt_is_hashed_as_its_effort_renders_it(tmp_path: Path) -> None:
    """A reasoning model through the prefix router with no special case: the ingress reads the model's
    thinking format from the same tokenizer, so `reasoning_effort: none` (Qwen3's
    `enable_thinking=False`: an empty thinking block after the generation prompt) is hashed as
    the replica renders it, on Chat and Responses."""
    from tests.support.tiny_model import build_tokenizer
    from tests.support.tiny_thinking import QWEN3_TEMPLATE, THINK_TOKENS

    tokenizer = build_tokenizer(tmp_path, added=THINK_TOKENS, template=QWEN3_TEMPLATE)
    (tmp_path / "config.json").write_text("{}")  # a model directory, as far as the ingress looks
    hasher = PromptHasher([tiny_config(tmp_path)])
    messages = [{"role": "user", "content": "What is the weather in Paris today? Answer in a word."}]

    def rendered(**kwargs: Any) -> tuple[int, ...]:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        return tuple(block_hashes(tokenizer.encode(text, add_special_tokens=False), 4))

    off, on = rendered(enable_thinking=False), rendered()
    assert off != on
    assert hasher.hashes({"messages": messages, "reasoning_effort": "none"}) == off
    assert hasher.hashes({"messages": messages, "reasoning_effort": "low"}) == hasher.hashes({"messages": messages}) == on
    assert hasher.hashes({"input": messages, "reasoning": {"effort": "minimal"}}, responses=True) == off


def test_an_adapters_routing_hash_is_its_own_chain(tiny_model_dir: Path, lora_adapters: dict[str, Path], tmp_path: Path) -> None:
    """A LoRA adapter's request hashes as the replica's cache chains it (from the adapter's root),
    so the router sends it where that adapter's blocks are, never where the base's same prompt is."""
    config = tiny_config(tiny_model_dir, max_num_batched_tokens=512, enable_lora=True, lora_modules={n: str(p) for n, p in lora_adapters.items()}, spec_decoding="off")
    body = {"model": "qv-r4", "messages": [MESSAGES[0], {"role": "user", "content": " ".join([MESSAGES[1]["content"]] * 4)}], "max_tokens": 2}
    hasher = PromptHasher([config])
    hashes = hasher.hashes(body)
    _, cached = serve_once(config, tmp_path, "/v1/chat/completions", body)
    assert len(hashes) > 4 and set(hashes) <= cached
    assert not set(hashes) & set(hasher.hashes({**body, "model": "tiny"}))
