"""The guided benchmark's five request variants, and how each response is read.

Owns: the constraints (a people schema and a patch grammar that no `--max-tokens` output can
complete), each variant's request body, one request sent and timed, and what a response says:
usage, how it finished, whether a constrained output begins as its format says.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Any

import httpx

VARIANTS = ("unconstrained", "unconstrained_long", "json_schema", "function_tool", "lark_tool")
# The unconstrained run each constrained variant is held against: the same prompt, or (for the
# tool variants, whose prompts carry the tools' description) one of the same length.
BASELINE = {"json_schema": "unconstrained", "function_tool": "unconstrained_long", "lark_tool": "unconstrained_long"}
INSTRUCTION = "\n\nList the people in this text with their ages."
TARGET_RATIO = 0.85  # the target: grammar-constrained decoding costs at most 15% of throughput

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def people_schema(min_items: int) -> dict[str, Any]:
    """{"people": [person, ...]} with at least `min_items` persons: each takes more than one
    token, so no output of fewer than `min_items` tokens completes it."""
    return {
        "type": "object",
        "properties": {"people": {"type": "array", "items": PERSON, "minItems": min_items}},
        "required": ["people"],
        "additionalProperties": False,
    }


def patch_grammar(min_lines: int) -> str:
    """A patch adding one file of `min_lines` to 2*`min_lines` lines (the patch format of
    tests/e2e/test_guided_default_model.py, with a long repetition)."""
    return (
        f'start: "*** Begin Patch" LF "*** Add File: " PATH LF line~{min_lines}..{2 * min_lines} "*** End Patch"\n'
        'line: "+" TEXT LF\n'
        r"PATH: /[a-z]{1,8}\.txt/" "\n"
        r"TEXT: /[a-z][a-z ]{1,23}/" "\n"
        'LF: "\\n"\n'
    )


@dataclass
class Workload:
    max_tokens: int
    served_name: str
    timeout: float
    system_text: str | None = None  # unconstrained_long's system message (rounds.calibrate_long_prompt)


def function_tool(max_tokens: int) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "record_people", "description": "Record people and their ages.", "parameters": people_schema(max_tokens)}}


def _lark_request(content: str, wl: Workload) -> dict[str, Any]:
    tool = {
        "type": "custom",
        "name": "apply_patch",
        "description": "Create a file with a patch.",
        "format": {"type": "grammar", "syntax": "lark", "definition": patch_grammar(wl.max_tokens)},
    }
    return {
        "model": wl.served_name,
        "input": content,
        "max_output_tokens": wl.max_tokens,
        "temperature": 0.0,
        "tools": [tool],
        "tool_choice": {"type": "custom", "name": "apply_patch"},
    }


def request_for(variant: str, content: str, wl: Workload) -> tuple[str, dict[str, Any]]:
    """(path, body) of one request of `variant`."""
    if variant == "lark_tool":
        return "/v1/responses", _lark_request(content, wl)
    messages = [{"role": "user", "content": content}]
    if variant == "unconstrained_long":
        messages.insert(0, {"role": "system", "content": wl.system_text or ""})
    body: dict[str, Any] = {"model": wl.served_name, "messages": messages, "max_tokens": wl.max_tokens, "temperature": 0.0, "ignore_eos": True}
    if variant == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "people", "schema": people_schema(wl.max_tokens), "strict": True}}
    elif variant == "function_tool":
        body["tools"] = [function_tool(wl.max_tokens)]
        body["tool_choice"] = {"type": "function", "function": {"name": "record_people"}}
    elif variant not in ("unconstrained", "unconstrained_long"):
        raise ValueError(f"unknown variant {variant!r}")
    return "/v1/chat/completions", body


@dataclass
class Result:
    ok: bool = False
    error: str | None = None
    start: float = 0.0
    end: float = 0.0
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish: str | None = None  # finish_reason (chat) or status[/incomplete reason] (responses)
    off_format: bool = False


def _on_prefix(text: str, head: str) -> bool:
    """`text` begins with `head`, or (cut short) is a prefix of it; whitespace is ignored (the
    server picks the JSON separators)."""
    text, head = re.sub(r"\s+", "", text), re.sub(r"\s+", "", head)
    return text.startswith(head) or head.startswith(text)


def _read_responses(body: dict[str, Any], res: Result) -> None:
    usage = body.get("usage") or {}
    res.completion_tokens = usage.get("output_tokens") or 0
    res.prompt_tokens = usage.get("input_tokens")
    res.cached_tokens = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    reason = (body.get("incomplete_details") or {}).get("reason")
    res.finish = f"{body.get('status')}/{reason}" if reason else body.get("status")
    items = body.get("output") or []
    res.off_format = not (items and items[0].get("type") == "custom_tool_call" and _on_prefix(items[0].get("input") or "", "*** Begin Patch"))


def read_response(variant: str, body: dict[str, Any], res: Result) -> None:
    """Usage, how it finished, and whether a constrained output begins as its format says."""
    if variant == "lark_tool":
        _read_responses(body, res)
        return
    usage = body.get("usage") or {}
    res.completion_tokens = usage.get("completion_tokens") or 0
    res.prompt_tokens = usage.get("prompt_tokens")
    res.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    choice = (body.get("choices") or [{}])[0]
    res.finish = choice.get("finish_reason")
    message = choice.get("message") or {}
    if variant == "json_schema":
        res.off_format = not _on_prefix(message.get("content") or "", '{"people":[')
    elif variant == "function_tool":
        calls = message.get("tool_calls") or []
        arguments = calls[0]["function"]["arguments"] if calls else ""
        # The call wrapper takes tokens too: with a small --max-tokens the arguments may stop
        # before '{"people":[' is complete; a prefix of it is on format.
        if calls:
            res.off_format = not (calls[0]["function"]["name"] == "record_people" and _on_prefix(arguments, '{"people":['))
        else:  # cut before its arguments, the call comes back as text
            res.off_format = not _on_prefix(message.get("content") or "", '<tool_call>{"name":"record_people","arguments":{"people":[')


async def one_request(client: httpx.AsyncClient, base_url: str, wl: Workload, variant: str, content: str, max_tokens: int | None = None) -> Result:
    """Send one request (`max_tokens` overrides the length, for calibration); never raises."""
    path, body = request_for(variant, content, wl)
    if max_tokens is not None:
        body["max_output_tokens" if "input" in body else "max_tokens"] = max_tokens
    res = Result(start=time.perf_counter())
    timeout = wl.timeout
    try:
        async with asyncio.timeout(timeout):
            resp = await client.post(base_url + path, json=body)
        res.end = time.perf_counter()
        if resp.status_code != 200:
            res.error = f"HTTP {resp.status_code}: {resp.text[:300]}"
            return res
        read_response(variant, resp.json(), res)
        res.ok = True
    except TimeoutError:
        res.error = f"timeout after {timeout:.0f}s"
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    if not res.end:
        res.end = time.perf_counter()
    return res
