"""api/http/openai/tools/ and api/http/openai/common/grammars.py on their own: the parser, the grammars, the prompt.

Grammars are checked the way the engine will use them: compiled by llguidance against a real
(tiny) tokenizer, then fed token ids. Embedded Lark grammars are checked against the `lark`
package, which must parse the same strings before and after renaming.
"""

from __future__ import annotations

import json
from typing import Any

import lark
import llguidance
import llguidance.hf
import msgspec
import pytest

from api.http.openai.chat.thinking import message_parts
from api.http.openai.common.grammars import format_guide, namespace_lark
from api.http.openai.tools.grammar import tool_guide
from api.http.openai.tools.parser import ToolCallParser
from api.http.openai.tools.prompt import render_conversation, template_takes_tools
from api.http.openai.tools.spec import format_call
from api.http.openai.tools.validate import build_toolset
from runtime.errors import InvalidRequest
from runtime.sampling import Guide

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False},
}
NOTE = {"type": "custom", "name": "note", "description": "Write a note."}
CALC = r"""
start: expr
?expr: term (("+" | "-") term)*
?term: NUMBER | "(" expr ")"
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
"""
CALC_TOOL = {"type": "custom", "name": "calc", "format": {"type": "grammar", "syntax": "lark", "definition": CALC}}


@pytest.fixture(scope="module")
def ll_tokenizer(tokenizer: Any) -> Any:
    return llguidance.hf.from_tokenizer(tokenizer)


def accepts(tokenizer: Any, ll_tokenizer: Any, grammar: str | Guide, text: str) -> bool:
    """Whether `grammar` (or a tool guide) accepts `text`; for a guide, `text` is the whole
    output, whose start its prefix (the prompt's end) must be."""
    if isinstance(grammar, Guide):
        if not text.startswith(grammar.prefix):
            return False
        grammar, text = grammar.definition, text[len(grammar.prefix) :]
    matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False)) and matcher.is_accepting()


# -- parser ------------------------------------------------------------------------------------


def parse(text: str, step: int, tools: list[dict[str, Any]] | None = None) -> list[tuple[Any, ...]]:
    parser = ToolCallParser(build_toolset(tools or [WEATHER, NOTE], "auto", True))  # type: ignore[arg-type]
    events = []
    for i in range(0, len(text), step):
        events += parser.feed(text[i : i + step])
    events += parser.finish()
    merged: list[tuple[Any, ...]] = []
    for kind, *rest in events:
        item = (kind, rest[0]) if kind == "text" else (kind, rest[1]) if kind == "delta" else (kind, rest[0].kind, rest[0].name) if kind == "start" else (kind, rest[0].kind, rest[0].name, rest[0].complete)
        if merged and kind in ("text", "delta") and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + item[1])
        else:
            merged.append(item)
    return merged


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_parser_text_and_calls_at_any_split(step: int) -> None:
    text = "Sure.\n" + format_call("function", "get_weather", '{"city":"Pa}ris \\"x\\""}') + "\n" + format_call("custom", "note", "line 1\n<b>line 2</b>")
    assert parse(text, step) == [
        ("text", "Sure."),
        ("start", "function", "get_weather"),
        ("delta", '{"city":"Pa}ris \\"x\\""}'),
        ("done", "function", "get_weather", True),
        ("start", "custom", "note"),
        ("delta", "line 1\n<b>line 2</b>"),
        ("done", "custom", "note", True),
    ]


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_parser_leaves_plain_text_alone(step: int) -> None:
    for text in ["Just text,\n with spaces  \n", "a <tool_calls> b < tool", "x <tool_call"]:
        assert parse(text, step) == [("text", text)]


def test_parser_other_key_order_and_cut_off_calls() -> None:
    swapped = '<tool_call>\n{"arguments": {"city": "Rome"}, "name": "get_weather"}\n</tool_call>'
    assert parse(swapped, 4)[1:] == [("delta", '{"city": "Rome"}'), ("done", "function", "get_weather", True)]
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ro'
    assert parse(cut, 4)[1:] == [("delta", '{"city": "Ro'), ("done", "function", "get_weather", False)]
    closed_late = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ro"}}'
    assert parse(closed_late, 4)[-1] == ("done", "function", "get_weather", True)


def test_chat_message_parts() -> None:
    toolset = build_toolset([WEATHER], "auto", True)
    assert toolset is not None
    content, calls, reasoning = message_parts(format_call("function", "get_weather", '{"city":"Oslo"}'), None, None, ToolCallParser(toolset))
    assert content is None and reasoning is None and msgspec.to_builtins(calls[0])["function"] == {"name": "get_weather", "arguments": '{"city":"Oslo"}'}
    assert message_parts("no call", None, None, ToolCallParser(toolset)) == ("no call", [], None)


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ([{"type": "function", "name": "x y"}], None, "tools[0].name"),
        ([WEATHER, WEATHER], None, "tools[1].name"),
        ([{"type": "code_interpreter"}], None, "tools[0].type"),
        ([{"type": "custom", "name": "g", "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}], None, "tools[0].format.definition"),
        ([{"type": "custom", "name": "g", "format": {"type": "grammar", "syntax": "regex", "definition": "(("}}], None, "tools[0].format.definition"),
        ([WEATHER], {"type": "custom", "name": "get_weather"}, "tool_choice"),
        ([WEATHER], {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "nope"}]}, "tool_choice"),
        ([WEATHER], "sometimes", "tool_choice"),
    ],
)
def test_invalid_tools(tools: list[dict[str, Any]], choice: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        build_toolset(tools, choice, None)
    assert info.value.param == param


def test_both_shapes_and_tool_choice_forms() -> None:
    chat_shape = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER["parameters"]}}]
    a = build_toolset(chat_shape, {"type": "function", "function": {"name": "get_weather"}}, None)
    b = build_toolset([WEATHER], {"type": "function", "name": "get_weather"}, None)
    assert a == b and a is not None and a.forced == "get_weather" and a.choice_json() == {"type": "function", "name": "get_weather"}
    allowed = build_toolset([WEATHER, NOTE], {"type": "allowed_tools", "mode": "required", "tools": [{"type": "custom", "name": "note"}]}, None)
    assert allowed is not None and [t.name for t in allowed.callable()] == ["note"] and allowed.choice == "required"
    none = build_toolset([WEATHER], "none", None)
    assert none is not None and none.callable() == () and tool_guide(none, None) is None


# -- grammars --------------------------------------------------------------------------------


def test_required_function_grammar(tokenizer: Any, ll_tokenizer: Any) -> None:
    toolset = build_toolset([WEATHER, NOTE, CALC_TOOL], "required", True)
    assert toolset is not None
    guide = tool_guide(toolset, None)
    assert guide is not None and guide.kind == "lark" and guide.param == "tools"
    g = guide
    weather = format_call("function", "get_weather", '{"city": "Paris"}')
    assert accepts(tokenizer, ll_tokenizer, g, weather)
    assert accepts(tokenizer, ll_tokenizer, g, weather + "\n" + format_call("custom", "calc", "1 + (2 - 3)"))
    assert accepts(tokenizer, ll_tokenizer, g, format_call("custom", "note", "anything\nat all"))
    assert not accepts(tokenizer, ll_tokenizer, g, "plain text")
    assert not accepts(tokenizer, ll_tokenizer, g, format_call("function", "get_weather", '{"town": "Paris"}'))
    assert not accepts(tokenizer, ll_tokenizer, g, format_call("function", "get_weather", "{}"))
    assert not accepts(tokenizer, ll_tokenizer, g, format_call("custom", "calc", "1 +"))
    assert not accepts(tokenizer, ll_tokenizer, g, format_call("function", "unknown", "{}"))


def test_auto_grammar_allows_text_but_forces_started_calls(tokenizer: Any, ll_tokenizer: Any) -> None:
    toolset = build_toolset([WEATHER], "auto", False)
    assert toolset is not None
    guide = tool_guide(toolset, None)
    assert guide is not None
    weather = format_call("function", "get_weather", '{"city": "Paris"}')
    assert accepts(tokenizer, ll_tokenizer, guide, "Hello, no tools needed.")
    assert accepts(tokenizer, ll_tokenizer, guide, "Let me look.\n" + weather)
    assert not accepts(tokenizer, ll_tokenizer, guide, weather + "\n" + weather)  # parallel_tool_calls false
    assert not accepts(tokenizer, ll_tokenizer, guide, '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>')

@pytest.mark.parametrize("choice", ["required", "auto"])
def test_max_tool_calls_bounds_the_grammar(tokenizer: Any, ll_tokenizer: Any, choice: str) -> None:
    weather = format_call("function", "get_weather", '{"city": "Paris"}')
    for max_calls in (1, 2, 3):
        toolset = build_toolset([WEATHER], choice, True, max_calls)
        assert toolset is not None
        guide = tool_guide(toolset, None)
        assert guide is not None
        for k in range(1, 5):
            calls = "\n".join([weather] * k)
            assert accepts(tokenizer, ll_tokenizer, guide, calls) == (k <= max_calls), (max_calls, k)



def test_auto_with_json_schema_text(tokenizer: Any, ll_tokenizer: Any) -> None:
    toolset = build_toolset([WEATHER], "auto", True)
    assert toolset is not None
    text = format_guide("json_schema", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, "text.format")
    guide = tool_guide(toolset, text)
    assert guide is not None
    assert accepts(tokenizer, ll_tokenizer, guide, '{"a": 1}')
    assert accepts(tokenizer, ll_tokenizer, guide, format_call("function", "get_weather", '{"city": "x"}'))
    assert not accepts(tokenizer, ll_tokenizer, guide, "free text")


def test_regex_custom_tool(tokenizer: Any, ll_tokenizer: Any) -> None:
    tool = {"type": "custom", "name": "date", "format": {"type": "grammar", "syntax": "regex", "definition": r"\d{4}-\d{2}-\d{2}"}}
    toolset = build_toolset([tool], {"type": "custom", "name": "date"}, True)
    assert toolset is not None
    guide = tool_guide(toolset, None)
    assert guide is not None
    assert accepts(tokenizer, ll_tokenizer, guide, format_call("custom", "date", "2024-01-31"))
    assert not accepts(tokenizer, ll_tokenizer, guide, format_call("custom", "date", "Jan 31"))


@pytest.mark.parametrize(
    ("grammar", "good", "bad"),
    [
        (CALC, ["1+2", "(1 - 2) + 3", " 4 "], ["1+", "()", "a"]),
        (
            'start: greeting ("," NAME)*\ngreeting: "hi" | "hello"\nNAME: /[a-z]+/\n// start: never\n',
            ["hi", "hello,bob,al"],
            ["hey", "hi,", "hi,Bob"],
        ),
        ('start: item+\n?item: A | b\nA: "a"\nb: "[" A? "]"\n', ["a", "[]", "a[a]"], ["", "[[]]", "b"]),
    ],
)
def test_namespaced_grammar_parses_the_same(grammar: str, good: list[str], bad: list[str]) -> None:
    renamed = namespace_lark(grammar, "swy_g0_")
    assert "swy_g0_start" in renamed
    original = lark.Lark(grammar, start="start")
    embedded = lark.Lark(renamed, start="swy_g0_start")
    for text in good:
        original.parse(text)
        embedded.parse(text)
    for text in bad:
        for parser in (original, embedded):
            with pytest.raises(lark.exceptions.LarkError):
                parser.parse(text)


def test_namespacing_keeps_llguidance_extensions() -> None:
    grammar = 'start: a b c\na[stop="]"]: /[a-z]+/\nb: %json {"type": "string", "x{": "}"}\nc: <|im_end|> "start" A\nA: "x"{1,3}\n'
    renamed = namespace_lark(grammar, "p_")
    assert 'p_a[stop="]"]: /[a-z]+/' in renamed
    assert '%json {"type": "string", "x{": "}"}' in renamed
    assert 'p_c: <|im_end|> "start" P_A' in renamed
    assert llguidance.LLMatcher.validate_grammar(renamed.replace("p_start", "start")) == ""


# -- the prompt --------------------------------------------------------------------------------

TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %} {{ t.function.name }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}<|im_end|>\n{% endfor %}"
)


def history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "cold"},
    ]


def test_fallback_prompt_describes_tools_and_rewrites_history(tokenizer: Any) -> None:
    toolset = build_toolset([WEATHER, NOTE], "required", True)
    messages, kwargs = render_conversation(history(), toolset, template_tools=False)
    assert kwargs == {}
    system = messages[0]
    assert system["role"] == "system" and "get_weather" in system["content"] and "note" in system["content"]
    assert "You must call at least one tool" in system["content"]
    assert messages[2]["content"] == format_call("function", "get_weather", '{"city": "Oslo"}') and "tool_calls" not in messages[2]
    assert messages[3] == {"role": "user", "content": "<tool_response>\ncold\n</tool_response>"}
    assert template_takes_tools(tokenizer) is False
    tokenizer.apply_chat_template(messages, tokenize=False)


def test_tool_capable_template_gets_tools(tokenizer: Any) -> None:
    toolset = build_toolset([WEATHER, NOTE], "auto", True)
    original = tokenizer.chat_template
    tokenizer.chat_template = TOOL_TEMPLATE
    try:
        assert template_takes_tools(tokenizer)
        messages, kwargs = render_conversation(history(), toolset, template_tools=True)
        assert [t["function"]["name"] for t in kwargs["tools"]] == ["get_weather"]
        assert "note" in messages[0]["content"] and "get_weather" not in messages[0]["content"]  # custom tools: the block
        assert messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
        assert messages[3]["role"] == "tool"
        text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        assert "TOOLS: get_weather" in text and 'CALL get_weather {"city": "Oslo"}' in text
    finally:
        tokenizer.chat_template = original


def test_json_schema_guide() -> None:
    guide = format_guide("json_schema", {"type": "object"}, "response_format", "response_format.json_schema.schema")
    assert guide is not None and guide.kind == "json_schema" and json.loads(guide.definition) == {"type": "object"}
    assert format_guide("text", None, "x") is None
    with pytest.raises(InvalidRequest) as info:
        format_guide("json_schema", {"type": 5}, "response_format", "response_format.json_schema.schema")
    assert info.value.param == "response_format.json_schema.schema"




# -- calls only to callable tools; text after calls; text offsets ---------------------------


@pytest.mark.parametrize("step", [1, 3, 1000])
@pytest.mark.parametrize(
    "call",
    [
        format_call("function", "launch_missiles", '{"now": true}'),
        format_call("custom", "rm_rf", "/"),
        '<tool_call>\n{"arguments": {"now": true}, "name": "launch_missiles"}\n</tool_call>',
        '<tool_call>\n{"name": "launch_missiles", "arguments": {"now": tr',  # cut off
    ],
)
def test_a_call_to_an_undeclared_tool_stays_text(step: int, call: str) -> None:
    text = "Hmm. " + call
    assert parse(text, step) == [("text", text)]


def test_a_declared_but_disallowed_tool_stays_text() -> None:
    toolset = build_toolset([WEATHER, NOTE], {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "custom", "name": "note"}]}, None)
    assert toolset is not None
    weather = format_call("function", "get_weather", '{"city": "Oslo"}')
    parser = ToolCallParser(toolset)
    events = parser.feed(weather + "\n" + format_call("custom", "note", "hi")) + parser.finish()
    assert "".join(e[1] for e in events if e[0] == "text") == weather
    assert [c.name for c in parser.calls] == ["note"]


@pytest.mark.parametrize("step", [1, 2, 7, 1000])
def test_text_after_a_call_starts_at_its_first_character(step: int) -> None:
    weather = format_call("function", "get_weather", '{"city": "Oslo"}')
    assert parse(weather + "\n\n  Done.\n", step) == [
        ("start", "function", "get_weather"),
        ("delta", '{"city": "Oslo"}'),
        ("done", "function", "get_weather", True),
        ("text", "Done."),  # (whitespace at the very end, after calls, is dropped too)
    ]
    assert parse(weather + "\n \n", step)[-1] == ("done", "function", "get_weather", True)  # only whitespace after: none


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_text_events_say_where_their_text_starts(step: int) -> None:
    weather = format_call("function", "get_weather", '{"city": "Oslo"}')
    text = "Let me see. " + weather + "\nIt is <tool_calls> time " + format_call("custom", "nope", "x") + "\n" + format_call("custom", "note", "n") + "\nBye "
    parser = ToolCallParser(build_toolset([WEATHER, NOTE], "auto", True))  # type: ignore[arg-type]
    events = []
    for i in range(0, len(text), step):
        events += parser.feed(text[i : i + step])
    events += parser.finish()
    texts = [(e[1], e[2]) for e in events if e[0] == "text"]
    assert texts and all(text[start : start + len(t)] == t for t, start in texts)
    assert "".join(t for t, _ in texts) == "Let me see.It is <tool_calls> time " + format_call("custom", "nope", "x") + "Bye"


# -- function parameters must describe an object ---------------------------------------------


@pytest.mark.parametrize("parameters", [{"type": "string"}, {"type": "array", "items": {}}, {"type": ["object", "null"]}, "object", ["x"]])
def test_parameters_must_be_an_object_schema(parameters: Any) -> None:
    for tool, param in (
        ({"type": "function", "name": "f", "parameters": parameters}, "tools[0].parameters"),
        ({"type": "function", "function": {"name": "f", "parameters": parameters}}, "tools[0].function.parameters"),
    ):
        with pytest.raises(InvalidRequest) as info:
            build_toolset([tool], None, None)
        assert info.value.param == param and "'f'" in str(info.value)


def test_parameters_without_a_type_are_an_object(tokenizer: Any, ll_tokenizer: Any) -> None:
    tool = {"type": "function", "name": "f", "parameters": {"properties": {"n": {"type": "integer"}}, "required": ["n"]}}
    toolset = build_toolset([tool], "required", True)
    assert toolset is not None and toolset.tools[0].openai()["parameters"] == tool["parameters"]  # echoed as sent
    guide = tool_guide(toolset, None)
    assert guide is not None
    assert accepts(tokenizer, ll_tokenizer, guide, format_call("function", "f", '{"n": 3}'))
    assert not accepts(tokenizer, ll_tokenizer, guide, format_call("function", "f", "3"))


# -- JSON as shown is JSON as forced ----------------------------------------------------------


def test_the_prompt_shows_json_the_way_the_grammar_forces_it(tokenizer: Any, ll_tokenizer: Any) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "array", "items": {"type": "integer"}}}, "required": ["city", "days"]}
    toolset = build_toolset([{"type": "function", "name": "forecast", "parameters": schema}], "required", False)
    assert toolset is not None
    guide = tool_guide(toolset, None)
    assert guide is not None
    # The client's compact arguments are shown re-serialized, in the layout the grammar forces.
    compact = '{"city":"Oslo","days":[1,2]}'
    history = [
        {"role": "user", "content": "Forecast?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "forecast", "arguments": compact}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    messages, _ = render_conversation(history, toolset, template_tools=False)
    shown_call = messages[2]["content"]
    assert shown_call == format_call("function", "forecast", '{"city": "Oslo", "days": [1, 2]}')
    assert accepts(tokenizer, ll_tokenizer, guide, shown_call)
    assert not accepts(tokenizer, ll_tokenizer, guide, format_call("function", "forecast", compact))
    # The format example and the schema in the tools block use the same separators.
    block = messages[0]["content"]
    assert json.dumps(schema) in block and '{"ARGUMENT": "VALUE"}' in block
    # Structured outputs follow the same layout.
    text = format_guide("json_schema", schema, "text.format")
    assert text is not None and text.kind == "json_schema"
    from actors.guidance import guide_grammar

    assert accepts(tokenizer, ll_tokenizer, guide_grammar(text), '{"city": "Oslo", "days": [1, 2]}')
    assert not accepts(tokenizer, ll_tokenizer, guide_grammar(text), compact)


def test_schema_validation_is_cached_by_schema_text(monkeypatch: pytest.MonkeyPatch) -> None:
    import api.http.openai.common.grammars

    calls: list[str] = []
    real = api.http.openai.common.grammars.json_schema_grammar

    def counting(schema: Any) -> str:
        calls.append(schema)
        return real(schema)

    monkeypatch.setattr(api.http.openai.common.grammars, "json_schema_grammar", counting)
    schema = {"type": "object", "properties": {"unique_to_this_test": {"type": "string"}}}
    for _ in range(3):
        build_toolset([{"type": "function", "name": "f", "parameters": schema}], None, None)
        format_guide("json_schema", schema, "text.format")
    assert len(calls) == 1


def test_tool_outputs_reach_a_tool_capable_template(tokenizer: Any) -> None:
    """function_call_output and custom_tool_call_output, through input_messages and the
    template path, end up in the encoded prompt (the fallback path: test_responses_wire.py)."""
    from actors.tokenizer import encode_prompt
    from api.http.openai.responses.input import input_messages
    from runtime.request import Prompt

    items = [
        {"role": "user", "content": "Weather, and a note?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "c1", "output": {"sky": "HAIL-3C"}},
        {"type": "custom_tool_call", "call_id": "c2", "name": "note", "input": "remember the milk"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "NOTE-SAVED-77"},
    ]
    toolset = build_toolset([WEATHER, NOTE], "auto", True)
    original = tokenizer.chat_template
    tokenizer.chat_template = TOOL_TEMPLATE
    try:
        messages, kwargs = render_conversation(input_messages(items, None), toolset, template_tools=True)
        text = tokenizer.decode(encode_prompt(tokenizer, Prompt(messages=messages, chat_template_kwargs=kwargs)))
    finally:
        tokenizer.chat_template = original
    assert 'CALL get_weather {"city": "Oslo"}' in text and format_call("custom", "note", "remember the milk") in text
    assert '{"sky": "HAIL-3C"}' in text and "NOTE-SAVED-77" in text
    assert text.index("remember the milk") < text.index("NOTE-SAVED-77")


@pytest.mark.parametrize("fmt", ["qwen3_coder", "pythonic"])
def test_xml_and_pythonic_calls_are_held_to_their_schema(tokenizer: Any, ll_tokenizer: Any, fmt: str) -> None:
    """Qwen3-Coder's XML and pythonic calls, forced: the schema's types, enums, required
    parameters, each parameter once and in the schema's order, as the JSON formats' calls are
    held to it (llguidance's JSON keeps a schema's property order too)."""
    from api.http.openai.tools.formats.pythonic import Pythonic
    from api.http.openai.tools.formats.qwen3_coder import Qwen3Coder

    properties = {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"type": "string", "enum": ["c", "f"]}, "tags": {"type": "array", "items": {"type": "string"}}}
    plan = {"type": "function", "function": {"name": "plan", "parameters": {"type": "object", "properties": properties, "required": ["city", "days"]}}}
    toolset = build_toolset([plan], "required", True)
    assert toolset is not None
    guide = (Qwen3Coder if fmt == "qwen3_coder" else Pythonic)(tokenizer).guide(toolset, None)
    assert guide is not None

    def call(*args: tuple[str, object]) -> str:
        if fmt == "pythonic":
            return "[plan(" + ", ".join(f"{k}={v!r}" for k, v in args) + ")]"
        body = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n" for k, v in args)
        return f"<tool_call>\n<function=plan>\n{body}</function>\n</tool_call>"

    assert accepts(tokenizer, ll_tokenizer, guide, call(("city", "Paris"), ("days", 3)))
    assert accepts(tokenizer, ll_tokenizer, guide, call(("city", "Paris"), ("days", 3), ("unit", "f"), ("tags", ["a", "b"])))
    assert accepts(tokenizer, ll_tokenizer, guide, call(("city", "Paris"), ("days", 3), ("tags", [])))  # an optional one left out
    assert not accepts(tokenizer, ll_tokenizer, guide, call(("days", 3), ("city", "Paris")))  # in the schema's order
    assert not accepts(tokenizer, ll_tokenizer, guide, call(("city", "Paris"), ("days", "three")))  # an integer
    assert not accepts(tokenizer, ll_tokenizer, guide, call(("city", "Paris"), ("days", 2.5)))
    assert not accepts(tokenizer, ll_tokenizer, guide, call(("city", "Paris")))  # days is required
    assert not accepts(tokenizer, ll_tokenizer, guide, call(("city", "Paris"), ("days", 3), ("unit", "kelvin")))  # not in its enum
    assert not accepts(tokenizer, ll_tokenizer, guide, call(("city", "Paris"), ("days", 3), ("days", 4)))  # once
