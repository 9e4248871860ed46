"""A reasoning model's output in Chat's shapes: the message's `reasoning` (and
`reasoning_content`) beside its content and calls, and streamed `Delta`s of both.

Databricks' shape (`blocks`, its invocations and OpenAI-compatible chat paths): a reasoning
model's `message.content` is a list of content blocks, as Databricks answers for its
reasoning models: `{"type": "reasoning", "summary": [{"type": "summary_text", "text": ...}]}`
then `{"type": "text", "text": ...}`; streamed thinking comes as a one-block list in
`delta.content` and the answer as text, and usage says `reasoning_tokens` at its top level too.

Both read the output through the one output parser (tools/output.py: thinking first, then the
answer's calls), whose events chat/tool_calls.py turns into deltas. Imports api.http.openai.
"""

from __future__ import annotations

from typing import Any

from api.http.openai.chat.response import AssistantMessage, Delta, ToolCall
from api.http.openai.chat.tool_calls import ChatDeltas, chat_tool_call, reasoning_block
from api.http.openai.tools.output import OutputParser
from runtime.reasoning import ThinkingFormat
from runtime.sampling import Thinking


def message_parts(text: str, fmt: ThinkingFormat | None, thinking: Thinking | None, parser: Any) -> tuple[str | None, list[ToolCall], str | None]:
    """A whole output → (content, tool_calls, reasoning); `parser`: the tool format's (None: text).
    Content is None when only calls were made, or could be (a forcing tool_choice allows no text)."""
    output = OutputParser(fmt, thinking, parser)
    content, parsed, reasoning = output.whole(text)
    calls = [chat_tool_call(c) for c in parsed]
    return (content or None) if calls or output.forcing else content, calls, reasoning or None


def assistant_message(content: str | None, calls: list[ToolCall], reasoning: str | None, thinks: bool, blocks: bool) -> AssistantMessage:
    """The message; `thinks`: a reasoning model's, which says what it thought (null: nothing)."""
    if not thinks:
        return AssistantMessage(content=content, tool_calls=calls or None)
    if blocks:
        parts = ([reasoning_block(reasoning)] if reasoning else []) + ([{"type": "text", "text": content}] if content else [])
        return AssistantMessage(content=parts if reasoning else content, tool_calls=calls or None)
    return AssistantMessage(content=content, reasoning=reasoning, reasoning_content=reasoning, tool_calls=calls or None)


class StreamedMessage:
    """One choice's streamed output → Chat `Delta`s: thinking as `reasoning` (and
    `reasoning_content`), then the answer as `content` or `tool_calls`."""

    def __init__(self, fmt: ThinkingFormat | None, thinking: Thinking | None, parser: Any, blocks: bool = False) -> None:
        self.output = OutputParser(fmt, thinking, parser)
        self.chat = ChatDeltas(blocks)

    @property
    def called(self) -> bool:
        return bool(self.output.calls)

    def feed(self, text: str) -> list[Delta]:
        return self.chat.deltas(self.output.feed(text)) if text else []

    def finish(self) -> list[Delta]:
        return self.chat.deltas(self.output.finish())
