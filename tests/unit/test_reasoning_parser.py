"""Reasoning models: detection from the template, the streaming split of thinking and answer,
the token-level tracker, and what `reasoning_effort` asks.

The split is a property over every chunking: a stream fed in any pieces gives the same thinking
and answer as the whole text at once (what the non-streaming answer is made from), on the
outputs that trip a streaming parser: tags split across chunks, a second `<think>` after the first
`</think>`, a literal `</think>` in the answer, truncation mid-thinking, a tool call right after
thinking.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.http.openai.chat.thinking import StreamedMessage, message_parts
from api.http.openai.common.reasoning import ReasoningParser, split_reasoning, thinking_params
from api.http.openai.tools.output import OutputParser
from api.http.openai.tools.parser import ToolCallParser
from api.http.openai.tools.validate import build_toolset
from runtime.errors import InvalidRequest
from runtime.reasoning import ThinkingFormat, ThinkingTracker, detect_thinking
from runtime.sampling import Guide, Thinking
from tests.support.tiny_thinking import OPEN_TEMPLATE, QWEN3_TEMPLATE, THINK_TOKENS

OPENED = Thinking(open=True, end_ids=(2,))
MAYBE = Thinking(open=False, start_ids=(1,), end_ids=(2,))
FMT = ThinkingFormat(name="qwen3", start_ids=(1,), end_ids=(2,), opens_in_prompt=False, switch="enable_thinking")
R1 = ThinkingFormat(name="deepseek_r1", start_ids=(1,), end_ids=(2,), implicit_ends=("<tool_call>",), opens_in_prompt=True)

# (output, the prompt opened <think>?, thinking, answer)
CASES = [
    ("\nplan it\n</think>\n\nThe answer.", True, "plan it", "The answer."),
    ("<think>\nplan it\n</think>\n\nThe answer.", False, "plan it", "The answer."),
    ("  <think>x</think>y", False, "x", "y"),
    ("no thinking here", False, "", "no thinking here"),
    ("<thin", False, "", "<thin"),  # a start tag cut off is answer
    ("a</think>b<think>c</think>d", True, "a", "b<think>c</think>d"),  # a second <think>; a literal </think>
    ("still thinking when max_tokens hit </thi", True, "still thinking when max_tokens hit </thi", ""),
    ("step one\n\n", True, "step one", ""),
    ('plan</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', True, "plan", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'),
    ("", True, "", ""),
    ("\n\n</think>\n\nhi", True, "", "hi"),
    ("a < b </ c </think> d", True, "a < b </ c", "d"),
    ("plan <tool_call> in thought", True, "plan <tool_call> in thought", ""),  # qwen3 closes thinking before a call
]


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def stream(parser: ReasoningParser, pieces: list[str]) -> tuple[str, str]:
    thought, answer = "", ""
    for piece in pieces:
        t, a = parser.feed(piece)
        thought, answer = thought + t, answer + a
    t, a = parser.finish()
    return thought + t, answer + a


@pytest.mark.parametrize(("text", "opened", "thinking", "answer"), CASES)
def test_whole_output_splits_as_the_rules_say(text: str, opened: bool, thinking: str, answer: str) -> None:
    assert split_reasoning(FMT, OPENED if opened else MAYBE, text) == (thinking, answer)


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_every_chunking_agrees_with_the_whole(case: tuple[str, bool, str, str], cuts: list[int]) -> None:
    text, opened, thinking, answer = case
    assert stream(ReasoningParser(FMT, OPENED if opened else MAYBE), chunked(text, cuts)) == (thinking, answer)


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.sampled_from(["<think>", "</think>", "<", "</", "think", ">", " ", "\n", "x", "<tool_call>", "é"]), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=10),
    opened=st.booleans(),
)
def test_random_outputs_stream_as_they_split_whole(parts: list[str], cuts: list[int], opened: bool) -> None:
    text = "".join(parts)
    whole = split_reasoning(FMT, OPENED if opened else MAYBE, text)
    assert stream(ReasoningParser(FMT, OPENED if opened else MAYBE), chunked(text, cuts)) == whole
    assert "</think>" not in whole[0] and (not opened or whole[1] == "" or "</think>" in text)


GRANITE = ThinkingFormat(name="granite", start_ids=(1,), end_ids=(2,), opens_in_prompt=False, switch="thinking", default_on=False, answer_wrap=("<response>", "</response>"))


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.sampled_from(["<think>", "</think>", "<response>", "</response>", "<", "</", "resp", "onse>", " ", "x"]), max_size=16),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=10),
)
def test_granites_answer_wrapper_is_dropped_over_any_chunking(parts: list[str], cuts: list[int]) -> None:
    text = "".join(parts)
    whole = split_reasoning(GRANITE, MAYBE, text)
    parser = ReasoningParser(GRANITE, MAYBE)
    assert stream(parser, chunked(text, cuts)) == whole
    if text.lstrip().startswith("<think>") and "</think>" in text:  # thought: the answer is unwrapped
        answer = text.split("</think>", 1)[1].lstrip()
        assert whole[1] == (answer[len("<response>") :].lstrip() if answer.startswith("<response>") else answer).replace("</response>", "")
    if whole[1]:  # where the answer starts in the output: Responses' logprobs rely on it
        assert parser.answer_base is not None and text[parser.answer_base] == whole[1][0]
    plain = "<think>plan</think>\n<response> The answer.</response>"
    assert split_reasoning(GRANITE, MAYBE, plain) == ("plan", "The answer.")
    assert split_reasoning(GRANITE, MAYBE, "<think>plan</think><resp") == ("plan", "<resp")
    assert split_reasoning(GRANITE, None, "<response>kept</response>") == ("", "<response>kept</response>")  # thinking off: untouched


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_a_tool_call_tag_ends_thinking_where_the_family_says_so(cuts: list[int]) -> None:
    text = 'plan <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    expected = ("plan", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')
    assert split_reasoning(R1, OPENED, text) == expected
    assert stream(ReasoningParser(R1, OPENED), chunked(text, cuts)) == expected


def test_no_thinking_is_every_byte_unchanged() -> None:
    text = "  <think>looks like a tag</think>  "
    assert stream(ReasoningParser(FMT, None), chunked(text, [3, 9, 20])) == ("", text)


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_a_tool_call_after_thinking_is_read_from_the_answer_only(cuts: list[int]) -> None:
    toolset = build_toolset([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "auto", None)
    assert toolset is not None
    text = 'I could write <tool_call> here</think>\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    content, calls, reasoning = message_parts(text, FMT, OPENED, ToolCallParser(toolset))
    assert reasoning == "I could write <tool_call> here" and content is None and [c.function.name for c in calls] == ["f"]  # type: ignore[union-attr]
    message = StreamedMessage(FMT, OPENED, ToolCallParser(toolset))
    deltas = [d for piece in chunked(text, cuts) for d in message.feed(piece)] + message.finish()
    assert "".join(d.reasoning for d in deltas if isinstance(d.reasoning, str)) == "I could write <tool_call> here"
    assert "".join(t.function.arguments for d in deltas if d.tool_calls for t in d.tool_calls) == '{"x": 1}'  # type: ignore[union-attr,misc]


def test_the_parser_is_linear_in_the_output() -> None:
    parser = ReasoningParser(FMT, OPENED)
    pieces = ["word "] * 20000 + ["</thin", "k>"] + ["answer "] * 20000
    import time

    started = time.perf_counter()
    thought, answer = stream(parser, pieces)
    assert time.perf_counter() - started < 2.0
    assert len(thought) == 5 * 20000 - 1 and answer.startswith("answer")


# -- detection ----------------------------------------------------------------------------------


def tokenizer_with(path: Path, template: str) -> Any:
    from tests.support.tiny_model import build_tokenizer

    return build_tokenizer(path, added=THINK_TOKENS, template=template)


def test_detects_qwen3_and_the_open_prompt_shape(tmp_path: Path) -> None:
    qwen = detect_thinking(tokenizer_with(tmp_path / "q", QWEN3_TEMPLATE))
    assert qwen is not None and qwen.name == "qwen3" and not qwen.opens_in_prompt and qwen.switch == "enable_thinking"
    assert len(qwen.start_ids) == len(qwen.end_ids) == 1 and qwen.end_ids[0] in qwen.forced_end
    opened = detect_thinking(tokenizer_with(tmp_path / "o", OPEN_TEMPLATE))
    assert opened is not None and opened.name == "deepseek_r1" and opened.opens_in_prompt and opened.switch is None
    assert detect_thinking(tokenizer_with(tmp_path / "q2", QWEN3_TEMPLATE), "none") is None


def test_a_model_without_a_thinking_template_does_not_think(tokenizer: Any) -> None:
    assert detect_thinking(tokenizer) is None
    forced = detect_thinking(tokenizer, "deepseek_r1", {"low": 7})
    assert forced is not None and forced.budgets["low"] == 7 and forced.name == "deepseek_r1"
    with pytest.raises(ValueError):
        detect_thinking(tokenizer, "gpt_oss")


def test_the_tracker_counts_thinking_tokens_by_id() -> None:
    tracker = ThinkingTracker(Thinking(open=False, start_ids=(1,), end_ids=(2,), budget=3))
    for token in (1, 5, 5):
        tracker.push(token)
    assert tracker.thinking and tracker.count == 3 and tracker.over_budget()
    tracker.push(2)
    tracker.push(9)
    assert tracker.done and tracker.count == 4
    never = ThinkingTracker(Thinking(open=False, start_ids=(1,), end_ids=(2,)))
    never.push(5)
    never.push(1)
    assert never.done and never.count == 0
    implicit = ThinkingTracker(Thinking(open=True, end_ids=(2,), implicit_end_ids=((7,),)))
    for token in (5, 7, 5):
        implicit.push(token)
    assert implicit.done and implicit.count == 1


def test_whitespace_before_the_start_tag_is_thought_once_the_tag_follows() -> None:
    """`\n<think>`: the newline counts as thinking with the tag (the text parser drops it),
    and the budget applies; whitespace then anything else is all answer."""
    spec = Thinking(open=False, start_ids=(1,), space_ids=frozenset({9}), end_ids=(2,), budget=4)
    tracker = ThinkingTracker(spec)
    for token in (9, 9, 1):
        assert not tracker.may_reach_budget(1) or token == 1
        tracker.push(token)
    assert tracker.thinking and tracker.count == 3 and not tracker.over_budget()
    tracker.push(5)
    assert tracker.over_budget()
    answer = ThinkingTracker(spec)
    for token in (9, 5, 1):
        answer.push(token)
    assert answer.done and answer.count == 0


@pytest.fixture(scope="module")
def qwen_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return tokenizer_with(tmp_path_factory.mktemp("qwen-tok"), QWEN3_TEMPLATE)


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(["<think>", "</think>", " ", "\n", "\n\n", "  ", "\t", "x", "a b"]), max_size=10))
def test_the_token_tracker_agrees_with_the_text_parser(qwen_tokenizer: Any, parts: list[str]) -> None:
    """Over outputs made of whole tags, whitespace and text (as a model writes them, token by
    token): the tracker thinks exactly when the text parser does, and its count ends where
    the answer begins."""
    fmt = detect_thinking(qwen_tokenizer)
    assert fmt is not None and not fmt.opens_in_prompt
    spec = fmt.control(True, None, guided=False)
    assert spec is not None
    ids = [t for part in parts for t in qwen_tokenizer.encode(part, add_special_tokens=False)]
    tracker = ThinkingTracker(spec)
    for token in ids:
        tracker.push(token)
    parser = ReasoningParser(fmt, spec)
    text = qwen_tokenizer.decode(ids)
    _, a1 = parser.feed(text)
    _, a2 = parser.finish()
    assert (tracker.count > 0) == parser.thought, (parts, tracker.count)
    if parser.thought:
        assert a1 + a2 == qwen_tokenizer.decode(ids[tracker.count :]).lstrip(), parts  # thinking + answer tokens = the output
    else:
        assert a1 + a2 == text


# -- reasoning_effort -----------------------------------------------------------------------------


def test_effort_none_turns_thinking_off_through_the_switch() -> None:
    kwargs, control = thinking_params(FMT, {}, "none", None, None, "reasoning_effort")
    assert kwargs == {"enable_thinking": False} and control is None


def test_explicit_template_kwargs_win_over_the_effort() -> None:
    kwargs, control = thinking_params(FMT, {"enable_thinking": True}, "none", {"enable_thinking": True}, None, "reasoning_effort")
    assert kwargs == {"enable_thinking": True} and control is not None and control.budget == FMT.budgets["low"]


def test_low_medium_high_set_budgets_and_a_guide_ends_bare() -> None:
    for effort in ("low", "medium", "high"):
        _, control = thinking_params(FMT, {}, effort, None, None, "reasoning_effort")
        assert control is not None and control.budget == FMT.budgets[effort] and not control.open
    _, plain = thinking_params(FMT, {}, None, None, None, "reasoning_effort")
    assert plain is not None and plain.budget is None
    _, guided = thinking_params(FMT, {}, "low", None, Guide(kind="json_object"), "reasoning_effort")
    assert guided is not None and guided.forced_end == FMT.forced_end_bare


def test_a_forced_call_turns_thinking_off() -> None:
    kwargs, control = thinking_params(FMT, {}, None, None, Guide(kind="lark", prefix="<tool_call>"), "reasoning_effort")
    assert kwargs == {"enable_thinking": False} and control is None


def test_unknown_effort_is_a_400_naming_the_field_and_other_models_ignore_it() -> None:
    with pytest.raises(InvalidRequest) as err:
        thinking_params(FMT, {}, "extreme", None, None, "reasoning.effort")
    assert err.value.param == "reasoning.effort"
    assert thinking_params(None, {"a": 1}, "none", None, None, "reasoning_effort") == ({"a": 1}, None)


# -- every surface's stream against its whole answer ----------------------------------------------

CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
# The pieces a thinking output is drawn from: tags whole and cut, a tool call, words, whitespace.
PIECES = ["<think>", "</think>", "<", "</", "think", ">", " ", "\n", "\n\n", "x", "é", "<tool_call>", CALL]


def texts() -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(PIECES), max_size=14).map("".join)


def chat_stream(fmt: ThinkingFormat, spec: Thinking | None, toolset: Any, pieces: list[str]) -> tuple[str, str, list[tuple[str, str]]]:
    """(reasoning, content, calls) as a client accumulates Chat's streamed deltas."""
    message = StreamedMessage(fmt, spec, ToolCallParser(toolset))
    deltas = [d for piece in pieces for d in message.feed(piece)] + message.finish()
    reasoning = "".join(d.reasoning for d in deltas if isinstance(d.reasoning, str))
    assert reasoning == "".join(d.reasoning_content for d in deltas if isinstance(d.reasoning_content, str))
    content = "".join(d.content for d in deltas if isinstance(d.content, str))
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for t in d.tool_calls if isinstance(d.tool_calls, list) else []:
            entry = calls.setdefault(t.index, ["", ""])
            if not isinstance(t.function, msgspec.UnsetType):
                entry[0] += t.function.name or ""
                entry[1] += t.function.arguments
    return reasoning, content, [(n, a) for n, a in (calls[i] for i in sorted(calls))]


@settings(max_examples=300, deadline=None)
@given(text=texts(), cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=12), opened=st.booleans(), r1=st.booleans())
def test_chat_streams_what_it_answers_whole(text: str, cuts: list[int], opened: bool, r1: bool) -> None:
    """Chat: the deltas of any chunking, accumulated, are the whole message (reasoning, content
    and calls), with a tool parser after the reasoning parser and either family's rules."""
    fmt, spec = (R1 if r1 else FMT), (OPENED if opened else MAYBE)
    toolset = build_toolset([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "auto", None)
    content, calls, reasoning = message_parts(text, fmt, spec, ToolCallParser(toolset))
    whole = (reasoning or "", content or "", [(c.function.name, c.function.arguments) for c in calls])  # type: ignore[union-attr]
    assert chat_stream(fmt, spec, toolset, chunked(text, cuts)) == whole
    assert "</think>" not in whole[0] and all(a == '{"x": 1}' for _, a in whole[2])


def responses_output(fmt: ThinkingFormat, spec: Thinking | None, pieces: list[str]) -> list[tuple[str, str]]:
    """The final Response's output items, (type, text), from these deltas."""
    from api.http.openai.responses.events import ResponsesEventBuilder
    from api.http.openai.responses.params import responses_params
    from api.http.openai.responses.request import ResponsesRequest
    from api.http.openai.responses.view import _Output
    from runtime.messages import FinishReason, Usage

    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    params = responses_params(msgspec.convert({"input": "x", "tools": [tool]}, ResponsesRequest))
    output = _Output(ResponsesEventBuilder(params.response), OutputParser(fmt, spec, params.output_parser()), None)
    for piece in pieces:
        output.feed(piece)
    output.finish(FinishReason.STOP, Usage(prompt_tokens=1, completion_tokens=1))
    items = msgspec.to_builtins(output.builder.response.output)
    texts = {"reasoning": lambda i: i["content"][0]["text"], "message": lambda i: i["content"][0]["text"], "function_call": lambda i: i["arguments"]}
    return [(i["type"], texts[i["type"]](i)) for i in items]


@settings(max_examples=200, deadline=None)
@given(text=texts(), cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=12), opened=st.booleans())
def test_responses_items_are_the_same_over_any_chunking(text: str, cuts: list[int], opened: bool) -> None:
    """Responses: the reasoning item, message and calls do not depend on how the output came."""
    spec = OPENED if opened else MAYBE
    whole = responses_output(FMT, spec, [text])
    assert responses_output(FMT, spec, chunked(text, cuts)) == whole
    reasoning, _ = split_reasoning(FMT, spec, text)
    assert [t for kind, t in whole if kind == "reasoning"] == ([reasoning] if reasoning else [])


# -- history ------------------------------------------------------------------------------------------


def test_history_thinking_reaches_the_template_which_renders_or_drops_it(tmp_path: Path) -> None:
    """Chat `reasoning` / `reasoning_content` and Responses `reasoning` items go to the template
    as `reasoning_content`: Qwen3's renders it after the last user turn (a call's continuation)
    and drops it before."""
    from api.http.openai.chat.params import chat_request
    from api.http.openai.chat.request import ChatCompletionRequest
    from api.http.openai.responses.params import responses_params
    from api.http.openai.responses.request import ResponsesRequest
    from runtime.prompt_encoding import encode_prompt

    tokenizer = tokenizer_with(tmp_path, QWEN3_TEMPLATE)
    fmt = detect_thinking(tokenizer)

    def chat(messages: list[dict[str, Any]]) -> str:
        params = chat_request(msgspec.convert({"messages": messages}, ChatCompletionRequest), None, thinking=fmt)
        return str(tokenizer.decode(encode_prompt(tokenizer, params.prompt)))

    earlier = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning": "EARLIER"}, {"role": "user", "content": "c"}]
    assert "EARLIER" not in chat(earlier) and "b<|im_end|>" in chat(earlier)
    latest = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning_content": "LATEST"}]
    assert "<think>\nLATEST\n</think>\n\nb" in chat(latest)
    items = [
        {"role": "user", "content": "a"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "LATEST"}]},
        {"role": "assistant", "content": "b"},
    ]
    params = responses_params(msgspec.convert({"input": items}, ResponsesRequest), None, thinking=fmt)
    assert "<think>\nLATEST\n</think>\n\nb" in tokenizer.decode(encode_prompt(tokenizer, params.prompt))
