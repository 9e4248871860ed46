"""A chat template given by file (`--chat-template FILE`, the TOML key `chat_template`): read and
checked once, before anything loads, then put on the model's tokenizer (and a vision model's
processor) wherever one is loaded, so rendering, tool-call and thinking detection all see it.

For a model that ships no template (every chat request would be a 400) or one whose template
a user wants replaced (vLLM's flag of the same name). Imports jinja2 (transformers renders
templates with it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def template_error(path: str | None, flag: str = "--chat-template") -> str | None:
    """Why this template file cannot be used, in one line; None when it can (or none is given)."""
    if path is None:
        return None
    try:
        text = Path(path).expanduser().read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return f"{flag} {path!r}: cannot be read ({getattr(exc, 'strerror', None) or exc})"
    import jinja2

    try:
        jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(text)
    except jinja2.TemplateSyntaxError as exc:
        return f"{flag} {path!r}: not a Jinja template: line {exc.lineno}: {exc.message}"
    return None


def apply_template(path: str | None, *holders: Any) -> None:
    """Put the file's template on each holder (a tokenizer, a processor) that is not None."""
    if path is None:
        return
    text = Path(path).expanduser().read_text()
    for holder in holders:
        if holder is not None:
            holder.chat_template = text
