"""Forced tool calls stay within the declared properties: with tool_choice required or named and a schema with `city` and `unit` and no
`additionalProperties`, the grammar let the default model write `"required":` and other keys
no schema declared until it ran out of tokens. Objects are now closed to undeclared keys
unless the schema allows them, as vLLM's guided decoding does by default; the same for
response_format schemas. Checked on the token mask itself, with the tiny test tokenizer."""

from __future__ import annotations

from typing import Any

import pytest

from actors.guidance import GuideCompiler
from api.http.openai.common.grammars import format_guide
from api.http.openai.tools.grammar import tool_guide
from api.http.openai.tools.validate import build_toolset

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
HEAD = '<tool_call>\n{"name": "get_weather", "arguments": '
TAIL = "}\n</tool_call>"


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GuideCompiler:
    return GuideCompiler(tokenizer, len(tokenizer))


def accepts(compiler: GuideCompiler, guide: Any, text: str) -> bool:
    """Whether the guide's mask lets every token of `text` through, and ends there. `text`
    is the whole output, whose start the guide's prefix (the prompt's end) must be."""
    if not text.startswith(guide.prefix):
        return False
    matcher = compiler.matcher(guide)
    tokens = compiler._hf_tokenizer.encode(text[len(guide.prefix) :], add_special_tokens=False)
    return matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens) and matcher.is_accepting()


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_call_arguments_hold_only_declared_keys(compiler: GuideCompiler, choice: Any) -> None:
    guide = tool_guide(build_toolset(TOOLS, choice, parallel=False), None)
    assert accepts(compiler, guide, HEAD + '{"city": "Paris", "unit": "c"}' + TAIL)
    assert accepts(compiler, guide, HEAD + '{"city": "Paris"}' + TAIL)
    for extra in ('"required": ["city"]', '"type": "string"', '"country": "FR"'):
        assert not accepts(compiler, guide, HEAD + '{"city": "Paris", ' + extra + "}" + TAIL), extra


def test_schema_that_allows_more_keys_keeps_them(compiler: GuideCompiler) -> None:
    open_schema = {**WEATHER, "additionalProperties": True}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": open_schema}}]
    guide = tool_guide(build_toolset(tools, "required", parallel=False), None)
    assert accepts(compiler, guide, HEAD + '{"city": "Paris", "country": "FR"}' + TAIL)


def test_nested_objects_and_response_formats_are_closed_too(compiler: GuideCompiler) -> None:
    schema = {"type": "object", "properties": {"place": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    guide = format_guide("json_schema", schema, "response_format")
    assert accepts(compiler, guide, '{"place": {"city": "Paris"}}')
    assert not accepts(compiler, guide, '{"place": {"city": "Paris", "zip": "75001"}}')
    assert not accepts(compiler, guide, '{"place": {"city": "Paris"}, "when": "now"}')
