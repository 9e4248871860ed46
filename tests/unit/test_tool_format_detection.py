"""The tool-call format read from real chat templates (llama.cpp's set, tests/support/family_assets.py),
for every family docs/models.md names and the templates users run them with: the format the
model was trained to write, or our own block (hermes) where a template renders no tools, or
generic where it renders them in a way no format here reads."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime.tool_formats import detect_tool_format
from tests.support.family_assets import template

EXPECTED = {
    "Qwen-Qwen2.5-7B-Instruct": "hermes",
    "Qwen-Qwen3-0.6B": "hermes",
    "Qwen-QwQ-32B": "hermes",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": "hermes",
    "HuggingFaceTB-SmolLM3-3B": "hermes",
    "ibm-granite-granite-4.0": "hermes",  # Granite 4 writes <tool_call> blocks
    "Qwen3-Coder": "qwen3_coder",
    "meta-llama-Llama-3.1-8B-Instruct": "llama3_json",
    "meta-llama-Llama-3.2-3B-Instruct": "llama3_json",
    "meta-llama-Llama-3.3-70B-Instruct": "llama3_json",
    "mistralai-Mistral-Nemo-Instruct-2407": "mistral",
    "Mistral-Small-3.2-24B-Instruct-2506": "mistral",
    "mistralai-Ministral-3-14B-Reasoning-2512": "mistral",
    "unsloth-mistral-Devstral-Small-2507": "mistral",
    "ibm-granite-granite-3.3-2B-Instruct": "granite",
    "deepseek-ai-DeepSeek-V3.1": "deepseek_v3",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "deepseek_v3",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": "deepseek_v3",
    "LFM2-8B-A1B": "pythonic",  # lists its tools between <|tool_list_start|> markers
    "LFM2.5-8B-A1B": "pythonic",
    "openai-gpt-oss-120b": "openai",
    "google-gemma-2-2b-it": "hermes",  # renders no tools: our own block
    "microsoft-Phi-3.5-mini-instruct": "hermes",  # the same
    "moonshotai-Kimi-K2": "generic",  # renders tools in a format not read here
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_format_is_read_from_the_familys_real_template(name: str) -> None:
    assert detect_tool_format(SimpleNamespace(chat_template=template(name))) == EXPECTED[name]


def test_a_named_parser_wins_and_an_unknown_one_is_refused() -> None:
    tokenizer = SimpleNamespace(chat_template=template("Qwen-Qwen2.5-7B-Instruct"))
    assert detect_tool_format(tokenizer, "llama3_json") == "llama3_json"
    with pytest.raises(ValueError, match="tool call parser must be one of"):
        detect_tool_format(tokenizer, "kimi_k2")


def test_lfm2s_calls_are_wrapped_in_its_markers() -> None:
    from api.http.openai.tools.formats.pythonic import Pythonic

    assert Pythonic(SimpleNamespace(chat_template=template("LFM2-8B-A1B"))).wrapped
    assert not Pythonic(SimpleNamespace(chat_template="{{ messages }} [func_name1(params_name1=params_value1)] {{ tools }}")).wrapped


def test_phi4_mini_is_read_from_its_own_template() -> None:
    from tests.support.families import INLINE_TEMPLATES

    assert detect_tool_format(SimpleNamespace(chat_template=INLINE_TEMPLATES["microsoft-Phi-4-mini-instruct"])) == "phi4_mini_json"


@pytest.mark.parametrize(
    "output",
    [
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>',
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',  # the close missing, as Phi-4-mini often writes it
        '<|tool_call|>{"name": "get_weather", "arguments": {"city": "Paris"}}<|/tool_call|>',  # no list around it
        'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]',  # as vLLM's example template teaches
    ],
)
def test_phi4_minis_call_is_read_in_each_form_it_comes_in(output: str) -> None:
    from api.http.openai.tools.formats.json_calls import Phi4Mini
    from api.http.openai.tools.spec import Tool, ToolSet

    parser = Phi4Mini(SimpleNamespace(chat_template="")).parser(ToolSet((Tool("function", "get_weather", parameters={"type": "object"}),)))
    events = [e for half in (output[:17], output[17:]) for e in parser.feed(half)] + parser.finish()
    assert [e[0] for e in events] == ["start", "delta", "done"], events
    assert events[1][2] == '{"city": "Paris"}'
    text = Phi4Mini(SimpleNamespace(chat_template="")).parser(ToolSet((Tool("function", "get_weather", parameters={"type": "object"}),)))
    said = "Use functools.cache for that."  # the word alone is text
    events = text.feed(said) + text.finish()
    assert all(e[0] == "text" for e in events) and "".join(e[1] for e in events) == said, events
