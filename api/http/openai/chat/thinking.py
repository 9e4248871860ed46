"""A reasoning model's output in Chat's shapes: the message's `reasoning` (and
`reasoning_content`) beside its content and calls, and streamed `Delta`s of both.

Databricks' shape (`blocks`, its invocations and OpenAI-compatible chat paths): a reasoning
model's `message.content` is a list of content blocks, as Databricks answers for its
reasoning models: `{"type": "reasoning", "summary": [{"type": "summary_text", "text": ...}]}`
then `{"type": "text", "text": ...}`; streamed thinking comes as a one-block list in
`delta.content` and the answer as text, and usage says `reasoning_tokens` at its top level too.

The output parser pipeline: the reasoning parser (common/reasoning.py) first, then the
tool-call parser (chat/tool_calls.py) over the answer only, so a `<tool_call>` written while
thinking is never a call. A model that does not think (`fmt` None) goes straight to the tool
parser, byte for byte as before. Imports api.http.openai.
"""

from __future__ import annotations

from typing import Any

from api.http.openai.chat.response import AssistantMessage, Delta, ToolCall
from api.http.openai.chat.tool_calls import ChatDeltas, chat_message_parts
from api.http.openai.common.reasoning import ReasoningParser, split_reasoning
from runtime.reasoning import ThinkingFormat
from runtime.sampling import Thinking


def message_parts(text: str, fmt: ThinkingFormat | None, thinking: Thinking | None, parser: Any) -> tuple[str | None, list[ToolCall], str | None]:
    """A whole output → (content, tool_calls, reasoning); `parser`: the tool format's (None: text)."""
    reasoning = ""
    if fmt is not None:
        reasoning, text = split_reasoning(fmt, thinking, text)
    if parser is None:
        return text, [], reasoning or None
    content, calls, more = chat_message_parts(text, parser)
    return content, calls, (reasoning + more) or None


def reasoning_block(text: str) -> dict[str, Any]:
    return {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}


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
        self.blocks = blocks
        self.reasoning = ReasoningParser(fmt, thinking) if fmt is not None else None
        self.tools = ChatDeltas(parser) if parser is not None else None

    @property
    def called(self) -> bool:
        return self.tools is not None and self.tools.called

    def feed(self, text: str) -> list[Delta]:
        if self.reasoning is None:
            return self._answer(text)
        thought, answer = self.reasoning.feed(text)
        return self._thought(thought) + self._answer(answer)

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self.reasoning is not None:
            thought, answer = self.reasoning.finish()
            out = self._thought(thought) + self._answer(answer)
        return out + ([self._blocked(d) for d in self.tools.finish()] if self.tools is not None else [])

    def _thought(self, text: str) -> list[Delta]:
        if not text:
            return []
        return [Delta(content=[reasoning_block(text)])] if self.blocks else [Delta(reasoning=text, reasoning_content=text)]

    def _answer(self, text: str) -> list[Delta]:
        if self.tools is not None:
            return [self._blocked(d) for d in self.tools.feed(text)]
        return [Delta(content=text)] if text else []

    def _blocked(self, delta: Delta) -> Delta:
        """A reasoning delta the format's parser made, in Databricks' blocks where asked."""
        return Delta(content=[reasoning_block(delta.reasoning)]) if self.blocks and isinstance(delta.reasoning, str) else delta
