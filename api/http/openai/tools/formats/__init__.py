"""Tool-call formats, one module each, under the names runtime/tool_formats.py detects.

`model_format(runtime)` is the format a served model writes, bound to its tokenizer (made once
per model); `FORMATS` maps a name to its class. What a format is: base.py.
"""

from __future__ import annotations

from typing import Any

from api.http.openai.tools.formats.base import ToolFormat, check_custom_tools
from api.http.openai.tools.formats.deepseek import DeepSeek
from api.http.openai.tools.formats.harmony import Harmony
from api.http.openai.tools.formats.hermes import Generic, Hermes
from api.http.openai.tools.formats.json_calls import Granite, Llama3Json, Mistral, Phi4Mini
from api.http.openai.tools.formats.pythonic import Pythonic
from api.http.openai.tools.formats.qwen3_coder import Qwen3Coder

FORMATS: dict[str, type[ToolFormat]] = {
    cls.name: cls for cls in (Hermes, Generic, Llama3Json, Granite, Phi4Mini, Mistral, Pythonic, DeepSeek, Qwen3Coder, Harmony)
}
_BOUND: dict[tuple[str, int], ToolFormat] = {}


def model_format(runtime: Any) -> ToolFormat:
    """The format `runtime`'s model writes its calls in (Hermes for a runtime that names none)."""
    name = getattr(runtime, "tool_format", "") or "hermes"
    key = (name, id(runtime.tokenizer))
    if key not in _BOUND:
        _BOUND[key] = FORMATS[name](runtime.tokenizer)
    return _BOUND[key]


def plain(template_tools: bool = False) -> ToolFormat:
    """Hermes with no tokenizer: a chat template that does (or does not) render tools."""
    fmt = Hermes(None)
    fmt.template_tools = template_tools
    return fmt


def request_guide(fmt: ToolFormat, toolset: Any, text_guide: Any) -> Any:
    """The guide of a request: the format's, when a tool may be called now; else the text's."""
    if toolset is None or not toolset.callable():
        return text_guide
    check_custom_tools(fmt, toolset)
    return fmt.guide(toolset, text_guide)


def output_parser(fmt: ToolFormat, toolset: Any, prefix: str = "") -> Any:
    """A fresh parser of one output, when one is needed: the format's, where tools may be
    called now or the format always splits its output (harmony's channels); else None."""
    if toolset is not None and toolset.callable():
        return fmt.parser(toolset, prefix)
    return fmt.parser(None, prefix) if getattr(fmt, "thinks", False) else None
