"""Reasoning models: a model's thinking format, found from its chat template and tokenizer, and
`ThinkingTracker`, which follows a request's thinking by token ids.

Owns: `ThinkingFormat` (the tags, their token ids, the end-of-thinking sequence the engine
forces at a budget, whether the template's generation prompt opens `<think>` itself, the
template switch that turns thinking off, the effort budgets), `detect_thinking` (the format of
a tokenizer and chat template, or the family `--reasoning-parser` names) and
`ThinkingTracker` (thinking or answering, and how many tokens thought, one token at a time:
the detokenizer counts usage's reasoning tokens with it, the scheduler core enforces a
budget, the runner starts a grammar at the end of thinking).

Families (`<think>...</think>` before the answer unless said):
- qwen3: thinking on unless `enable_thinking=False` (an empty `<think></think>` after the
  generation prompt); later templates write `<think>` in the prompt.
- deepseek_r1: the prompt ends with `<think>\\n` (R1-0528) or the model opens it; no switch.
- deepseek_v3: DeepSeek-V3.1's `thinking` switch, off by default; on, the prompt opens `<think>`.
- granite: Granite 3.3's `thinking` switch, off by default (a system text asks for the tags).
- mistral: Magistral's `[THINK]...[/THINK]`, special tokens (the text keeps them); no switch.
Imports msgspec and runtime; the tokenizer object is transformers'.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from runtime.sampling import Thinking

PARSERS = ("auto", "qwen3", "deepseek_r1", "deepseek_v3", "granite", "mistral", "none")
_SWITCHES = {"qwen3": "enable_thinking", "deepseek_v3": "thinking", "granite": "thinking"}
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")  # xhigh and max: the high budget
# Thinking budgets in tokens per effort, unless the model's config sets its own.
DEFAULT_BUDGETS = {"low": 512, "medium": 2048, "high": 8192}
START, END = "<think>", "</think>"
_PROBE = [{"role": "user", "content": "Hi"}]


class ThinkingFormat(msgspec.Struct, frozen=True, kw_only=True):
    """How one served model thinks, found once at start-up."""

    name: str  # one of PARSERS
    start: str = START
    end: str = END
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    # The tokens whose text is whitespace alone: an output may open thinking after them (`\n<think>`).
    space_ids: frozenset[int] = frozenset()
    # Tags that end thinking without its end tag (deepseek_r1: a tool call's opening, which its
    # distilled models write without closing `</think>`): they belong to the answer. Qwen3
    # always closes thinking first, so a `<tool_call>` it writes while thinking stays thinking.
    implicit_ends: tuple[str, ...] = ()
    implicit_end_ids: tuple[tuple[int, ...], ...] = ()
    # What the engine writes at the budget: before the answer text, and before a grammar's start
    # (a grammar's first token comes right after the end tag).
    forced_end: tuple[int, ...] = ()
    forced_end_bare: tuple[int, ...] = ()
    opens_in_prompt: bool  # the generation prompt (thinking on) ends inside `<think>`
    switch: str | None = None  # the template kwarg that turns thinking off (False), if any
    default_on: bool = True  # thinking without the switch in the kwargs
    special: bool = False  # the tags are special tokens: the output's text must keep them
    answer_wrap: tuple[str, ...] = ()  # tags around the answer after thinking (granite: <response>)
    budgets: dict[str, int] = msgspec.field(default_factory=lambda: dict(DEFAULT_BUDGETS))

    def card(self) -> dict[str, Any]:
        """What /v1/models says of it."""
        return {"parser": self.name, "can_disable": self.switch is not None, "default_on": self.default_on, "budgets": dict(self.budgets)}

    def thinking_on(self, kwargs: dict[str, Any]) -> bool:
        """Whether a prompt rendered with these template kwargs thinks."""
        if self.switch is None:
            return True
        value = kwargs.get(self.switch, self.default_on)
        return value is not False if self.default_on else bool(value)

    def control(self, on: bool, budget: int | None, guided: bool) -> Thinking | None:
        """The engine's per-request view: None when thinking is off (nothing to track)."""
        if not on:
            return None
        return Thinking(
            open=self.opens_in_prompt,
            start_ids=self.start_ids,
            space_ids=self.space_ids,
            end_ids=self.end_ids,
            implicit_end_ids=self.implicit_end_ids,
            budget=budget,
            forced_end=self.forced_end_bare if guided else self.forced_end,
        )


def detect_thinking(tokenizer: Any, parser: str = "auto", budgets: dict[str, int] | None = None) -> ThinkingFormat | None:
    """The thinking format of this tokenizer's chat template; None for a model that does not
    think (or `parser` "none"). `parser` names the family to force one the template does not
    show; "auto" reads the template."""
    if parser not in PARSERS:
        raise ValueError(f"reasoning parser must be one of {', '.join(PARSERS)}, not {parser!r}")
    if parser == "none":
        return None
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    text = template if isinstance(template, str) else ""
    if parser == "auto":
        found = _family(text)
        if found is None:
            return None
        parser = found
    start, end = ("[THINK]", "[/THINK]") if parser == "mistral" else (START, END)
    switch = _SWITCHES.get(parser) if _SWITCHES.get(parser, "") in text else None
    on = {switch: True} if switch else {}
    opens = _opens_in_prompt(tokenizer, on, start, end) if text else False
    default_on = True
    if switch is not None:
        off = _generation_prompt(tokenizer, {switch: False})
        if off == _generation_prompt(tokenizer, on) or _opens_in_prompt(tokenizer, {switch: False}, start, end):
            switch = None  # the switch changes nothing, or does not close thinking: nothing turns it off
        else:
            default_on = _generation_prompt(tokenizer, {}) != off
    ids = _ids(tokenizer)
    implicit = ("<tool_call>",) if parser == "deepseek_r1" else ()
    return ThinkingFormat(
        name=parser,
        start=start,
        end=end,
        implicit_ends=implicit,
        start_ids=ids(start),
        space_ids=frozenset() if opens else _space_ids(tokenizer),
        end_ids=ids(end),
        implicit_end_ids=tuple(ids(tag) for tag in implicit if _single(tokenizer, tag)),
        forced_end=ids("\n" + end + "\n\n"),
        forced_end_bare=ids("\n" + end),
        opens_in_prompt=opens,
        switch=switch,
        default_on=default_on,
        answer_wrap=("<response>", "</response>") if parser == "granite" else (),
        special=start in getattr(tokenizer, "all_special_tokens", ()) or _special_added(tokenizer, start),
        budgets={**DEFAULT_BUDGETS, **(budgets or {})},
    )


def _family(text: str) -> str | None:
    """The thinking family a chat template shows (None: it does not think)."""
    if "[THINK]" in text and "[/THINK]" in text:
        return "mistral"
    if START not in text or END not in text:
        return None
    if "<response>" in text and "thinking" in text:
        return "granite"
    if re.search(r"\bthinking is defined", text):  # its own `thinking`, not `enable_thinking`
        return "deepseek_v3"
    return "qwen3" if "enable_thinking" in text else "deepseek_r1"


def _special_added(tokenizer: Any, text: str) -> bool:
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return any(token.content == text and token.special for token in decoder.values())


def _ids(tokenizer: Any) -> Any:
    return lambda text: tuple(tokenizer.encode(text, add_special_tokens=False))


def _space_ids(tokenizer: Any) -> frozenset[int]:
    """The tokens whose text is whitespace alone (as `str.isspace`, so as `str.lstrip` drops
    it: the text parser's rule), each decoded on its own: one batch over the vocabulary at
    start-up, for a model that opens thinking itself."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return frozenset(i for i, text in enumerate(texts) if text.isspace())


def _single(tokenizer: Any, text: str) -> bool:
    return len(tokenizer.encode(text, add_special_tokens=False)) == 1


def _generation_prompt(tokenizer: Any, kwargs: dict[str, Any]) -> str | None:
    """The text a generation prompt for one user turn renders (None: the template refuses it)."""
    try:
        return tokenizer.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True, **kwargs)
    except Exception:  # a template that needs more than a user turn
        return None


def _opens_in_prompt(tokenizer: Any, kwargs: dict[str, Any], start: str = START, end: str = END) -> bool:
    """Whether the generation prompt leaves a thinking tag open (the model starts thinking)."""
    whole = _generation_prompt(tokenizer, kwargs)
    try:
        bare = tokenizer.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=False, **kwargs)
    except Exception:  # a template that needs more than a user turn: assume the model opens it
        return False
    if whole is None:
        return False
    tail = whole[len(bare) :] if whole.startswith(bare) else whole[-64:]
    return tail.rfind(start) > tail.rfind(end)


class ThinkingTracker:
    """One request's thinking, token by token: `count` tokens thought so far (tags included),
    `thinking` while it has not ended. Linear: each token is compared with the end of the tags
    only.

    An output that opens thinking itself may write whitespace first (`\n<think>`), which the
    text parser drops: those tokens count as thinking once the tag follows (so thinking plus
    answer tokens are the output), and as answer if anything else does. Both families' tags
    are tokenizer-added tokens, matched before byte-level BPE and without lstrip/rstrip, so the
    tokenizer never merges a tag with the whitespace beside it."""

    __slots__ = ("spec", "count", "thinking", "maybe", "lead", "_recent", "_pending")

    def __init__(self, spec: Thinking) -> None:
        self.spec = spec
        self.count = 0
        self.thinking = spec.open
        self.maybe = not spec.open and bool(spec.start_ids)  # the output may still open it
        self.lead = 0  # whitespace tokens before the start tag (while it may still open)
        self._recent: list[int] = []
        self._pending = 0  # tokens of a start tag matched so far (when the output opens it)

    @property
    def done(self) -> bool:
        """Thinking is over (or never started): what follows is the answer."""
        return not self.thinking and not self.maybe

    def push(self, token: int) -> None:
        if self.maybe:
            start = self.spec.start_ids
            if token == start[self._pending]:
                self._pending += 1
                if self._pending == len(start):
                    self.maybe, self.thinking, self.count = False, True, self.lead + len(start)
                return
            if self._pending == 0 and token in self.spec.space_ids:
                self.lead += 1
                return
            self.maybe = False
            return
        if not self.thinking:
            return
        if any(len(tag) == 1 and token == tag[0] for tag in self.spec.implicit_end_ids):
            self.thinking = False
            return
        self.count += 1
        end = self.spec.end_ids
        self._recent.append(token)
        if len(self._recent) > len(end):
            del self._recent[0]
        if tuple(self._recent) == end:
            self.thinking = False

    def over_budget(self) -> bool:
        budget = self.spec.budget
        return self.thinking and budget is not None and self.count >= budget

    def may_reach_budget(self, more: int) -> bool:
        """Whether `more` tokens more could bring it to its budget (the core would then write
        the end of thinking after them): a step planned ahead must not guess past that."""
        if self.done or self.spec.budget is None:
            return False
        opening = self.lead + len(self.spec.start_ids) if self.maybe else 0  # the tag may yet open it, whitespace and all
        return self.count + opening + more >= self.spec.budget
