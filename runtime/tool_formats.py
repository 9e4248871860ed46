"""Which tool-call format a model writes: its name, read from the chat template once at start-up.

Owns: the format names (vLLM's `--tool-call-parser` names where vLLM has one) and
`detect_tool_format`, which reads a chat template the way llama.cpp's chat-format detection
does: by the markers the template teaches the model to write. The formats themselves (how a
call is prompted, forced, parsed and given an id) live at the edge, in
api/http/openai/tools/formats/, keyed by these names. Imports the standard library only.
"""

from __future__ import annotations

import re
from typing import Any

# name -> what marks it in a chat template (checked in this order: the more specific first).
FORMATS = (
    "openai",  # gpt-oss harmony: <|channel|>commentary to=functions.NAME ... <|message|>{...}<|call|>
    "qwen3_coder",  # Qwen3-Coder: <tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>
    "deepseek_v3",  # DeepSeek V3 / R1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>...<｜tool▁sep｜>NAME ... <｜tool▁call▁end｜>
    "mistral",  # [TOOL_CALLS][{"name": ..., "arguments": {...}}] or [TOOL_CALLS]NAME[ARGS]{...}; 9-character ids
    "phi4_mini_json",  # Phi-4-mini: tools on the system message; <|tool_call|>[{"name": ..., "arguments": {...}}]<|/tool_call|>
    "granite",  # Granite 3.x: <|tool_call|>[{"name": ..., "arguments": {...}}]
    "pythonic",  # LFM2 / Llama 3.2 and 4's pythonic templates: [NAME(k=v, ...)]
    "llama3_json",  # Llama 3.1-3.3: {"name": ..., "parameters": {...}} as the whole turn (or after <|python_tag|>)
    "hermes",  # Qwen 2.5 / 3, Hermes, SmolLM3: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
    "generic",  # a template that renders tools in a way none of the above reads: our own block and Hermes calls
)
PARSERS = ("auto", *FORMATS)


def template_text(tokenizer: Any) -> str:
    """The tokenizer's chat template as text (its tool-use variant where it has several)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default")
    return template if isinstance(template, str) else ""


def takes_tools(template: str) -> bool:
    """Whether a chat template renders a `tools` argument."""
    return re.search(r"\btools\b", template) is not None


def detect_tool_format(tokenizer: Any, parser: str = "auto") -> str:
    """The format this model's calls are written in: `parser` when named, else what its chat
    template teaches; a template that does not render tools is shown our own block (hermes)."""
    if parser not in PARSERS:
        raise ValueError(f"tool call parser must be one of {', '.join(PARSERS)}, not {parser!r}")
    if parser != "auto":
        return parser
    text = template_text(tokenizer)
    if "<|channel|>" in text and "<|message|>" in text:
        return "openai"
    if "<function=" in text and "<parameter=" in text:
        return "qwen3_coder"
    if "tool▁calls▁begin" in text:
        return "deepseek_v3"
    if "[TOOL_CALLS]" in text:
        return "mistral"
    if "<|tool|>" in text and "<|/tool|>" in text:
        return "phi4_mini_json"
    if "<|tool_call|>" in text:
        return "granite"
    if "<|tool_call_start|>" in text or "<|tool_list_start|>" in text or "[func_name1(" in text:  # LFM2's lists its tools so
        return "pythonic"
    if "<|python_tag|>" in text or '"parameters": dictionary of argument name' in text:
        return "llama3_json"
    if "<tool_call>" in text or not takes_tools(text):
        return "hermes"
    return "generic"
