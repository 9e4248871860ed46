"""Grammar-constrained decoding vs unconstrained: output tok/s at concurrency 16, one server.

python -m ops.bench.guided [--concurrency 16] [--rounds 3] [--requests-per-round 16] [--max-tokens 64]
                           [--out ops/results/NAME.json]

What it measures. One `switchyard serve` (default model, the embedded SmolLM2-135M-Instruct;
the server picks its dtype) on a free loopback port, and five request variants:

- `unconstrained`: /v1/chat/completions, plain text, `ignore_eos: true`;
- `unconstrained_long`: the same plus a system message (a text describing the function tool,
  with no constraint) cut so that the prompt has exactly as many tokens as `function_tool`'s
  (calibrated against the server's usage.prompt_tokens before the run): the control for the
  tool variants, whose prompts carry the tools' description;
- `json_schema`: the same, with `response_format: {type: json_schema}` (strict);
- `function_tool`: the same, with one function tool and `tool_choice` naming it (the call is
  forced: the tool-call wrapper and the arguments' JSON schema are enforced token by token);
- `lark_tool`: /v1/responses with one custom tool whose input is a Lark grammar (a patch
  format), forced by `tool_choice: {type: custom}`. The Responses API has no `ignore_eos`;
  the grammar masks EOS out until it is complete, which it cannot be (below).

Every variant sends the same prompts (a 96-token passage, `--prompt-tokens`, with a per-request
header `Request 00042.` so no request's user message is served from another's prefix cache,
then the same one-line instruction), the same `--max-tokens` (64), temperature 0,
non-streaming. Variants run in rounds: in each round every variant runs one block of
`--requests-per-round` requests closed-loop at `--concurrency` (c workers, each keeping one
request in flight), the variants' order rotating from round to round, so machine noise (and
any drift) falls on all variants alike. Unmeasured warmup first: one request per variant
(compiles and caches each grammar) plus a few plain ones.

Why the constrained runs cannot end early. A grammar ends when it is complete, and a shorter
answer would make a variant's tok/s incomparable (fewer tokens per prefill, shorter lock-step
batches). So the schemas and the grammar are chosen so that no output of `--max-tokens`
tokens can complete them: the JSON has an array of at least `--max-tokens` person objects
(`minItems`), and the Lark grammar wants at least `--max-tokens` lines of at least three
characters each. Every request therefore stops on its length limit with exactly `--max-tokens`
completion tokens, as the unconstrained one does with `ignore_eos`; that is checked, not
assumed (`short_of_max_tokens` counts any that stopped earlier). Even so, tok/s is generated
tokens / time: completion tokens (from each response's usage) summed over the variant's
blocks / the sum of those blocks' wall times (first send to last response), so a short
response could not inflate it.

How to read it. `ratio` = a variant's tok/s / `unconstrained` tok/s of the same run,
`ratio_long` the same over `unconstrained_long`. Each constrained variant has a baseline
(`baseline`): `json_schema` sends the very prompt of `unconstrained`; the tool variants'
prompts are longer (the tools are described in the system prompt, see `prompt_tokens`; that
part is the same for every request and comes from the prefix cache after the first, see
`cached_tokens`, but decode attends over it, a cost that is not the grammar's), so they are held
against `unconstrained_long` (matched to `function_tool`; `lark_tool`'s prompt is ~30 tokens
shorter, which flatters it slightly). The issue's target, a cost of at most 15%, is
`ratio_to_baseline` >= 0.85 (`meets_target`); `round_ratio` gives min / median / max of that
ratio per round: their spread is the noise.
`off_format` counts constrained outputs that do not begin as the format says (a sign the
guide was not applied). The machine's load average at start and end is in the JSON; with a
1-minute load above ~1 before the start, do not compare runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx

from ops.bench.load import percentile
from ops.bench.prompt import build_prompts, default_model_dir, load_tokenizer
from ops.bench.run import start_run, wait_for_quiet, write_results
from ops.bench.switchyard_server import switchyard_server

VARIANTS = ("unconstrained", "unconstrained_long", "json_schema", "function_tool", "lark_tool")
# The unconstrained run each constrained variant is held against: the same prompt, or (for the
# tool variants, whose prompts carry the tools' description) one of the same length.
BASELINE = {"json_schema": "unconstrained", "function_tool": "unconstrained_long", "lark_tool": "unconstrained_long"}
INSTRUCTION = "\n\nList the people in this text with their ages."
SERVED_NAME = "smollm2-135m-instruct"
TARGET_RATIO = 0.85  # the issue: grammar-constrained decoding costs at most 15% of throughput


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the constraints ---------------------------------------------------------------------------

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
    tests/responses/test_guided_default_model.py, with a long repetition)."""
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
    system_text: str | None = None  # unconstrained_long's system message (calibrate_long_prompt)


def function_tool(max_tokens: int) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "record_people", "description": "Record people and their ages.", "parameters": people_schema(max_tokens)}}


def request_for(variant: str, content: str, wl: Workload) -> tuple[str, dict[str, Any]]:
    """(path, body) of one request of `variant`."""
    max_tokens, served_name = wl.max_tokens, wl.served_name
    if variant == "lark_tool":
        tool = {
            "type": "custom",
            "name": "apply_patch",
            "description": "Create a file with a patch.",
            "format": {"type": "grammar", "syntax": "lark", "definition": patch_grammar(max_tokens)},
        }
        body = {
            "model": served_name,
            "input": content,
            "max_output_tokens": max_tokens,
            "temperature": 0.0,
            "tools": [tool],
            "tool_choice": {"type": "custom", "name": "apply_patch"},
        }
        return "/v1/responses", body
    messages = [{"role": "user", "content": content}]
    if variant == "unconstrained_long":
        messages.insert(0, {"role": "system", "content": wl.system_text or ""})
    body = {
        "model": served_name,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    schema = people_schema(max_tokens)
    if variant == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "people", "schema": schema, "strict": True}}
    elif variant == "function_tool":
        body["tools"] = [function_tool(max_tokens)]
        body["tool_choice"] = {"type": "function", "function": {"name": "record_people"}}
    elif variant not in ("unconstrained", "unconstrained_long"):
        raise ValueError(f"unknown variant {variant!r}")
    return "/v1/chat/completions", body


# -- one request -------------------------------------------------------------------------------


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


def read_response(variant: str, body: dict[str, Any], res: Result) -> None:
    """Usage, how it finished, and whether a constrained output begins as its format says."""
    if variant == "lark_tool":
        usage = body.get("usage") or {}
        res.completion_tokens = usage.get("output_tokens") or 0
        res.prompt_tokens = usage.get("input_tokens")
        res.cached_tokens = (usage.get("input_tokens_details") or {}).get("cached_tokens")
        reason = (body.get("incomplete_details") or {}).get("reason")
        res.finish = f"{body.get('status')}/{reason}" if reason else body.get("status")
        items = body.get("output") or []
        res.off_format = not (
            items and items[0].get("type") == "custom_tool_call" and _on_prefix(items[0].get("input") or "", "*** Begin Patch")
        )
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


def _on_prefix(text: str, head: str) -> bool:
    """`text` begins with `head`, or (cut short) is a prefix of it; whitespace is ignored (the
    server picks the JSON separators)."""
    text, head = re.sub(r"\s+", "", text), re.sub(r"\s+", "", head)
    return text.startswith(head) or head.startswith(text)


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


# -- blocks and rounds -------------------------------------------------------------------------


async def run_block(client: httpx.AsyncClient, base_url: str, wl: Workload, variant: str, contents: list[str], concurrency: int) -> tuple[float, list[Result]]:
    """All of `contents` closed-loop at `concurrency`; returns (wall seconds, results)."""
    results: list[Result] = []
    queue = list(reversed(contents))
    t0 = time.perf_counter()

    async def worker() -> None:
        while queue:
            content = queue.pop()
            results.append(await one_request(client, base_url, wl, variant, content))

    # Each request is bounded by its timeout; the block's own bound is belt and braces.
    async with asyncio.timeout(wl.timeout * (1 + len(contents) // max(1, concurrency)) + 30):
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return max((r.end for r in results), default=t0) - t0, results


def round_order(r: int) -> list[str]:
    k = r % len(VARIANTS)
    return list(VARIANTS[k:] + VARIANTS[:k])


def _prompt_len(tok: Any, messages: list[dict[str, str]]) -> int:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tok(text, add_special_tokens=False)["input_ids"])


async def calibrate_long_prompt(client: httpx.AsyncClient, base_url: str, wl: Workload, content: str, tok: Any) -> dict[str, Any]:
    """Set `wl.system_text` so that unconstrained_long's prompt has as many tokens as
    function_tool's, as the server counts them (its usage.prompt_tokens): a text describing the
    same tool (no constraint), cut to length with the model's own tokenizer and chat template."""
    plain = await one_request(client, base_url, wl, "unconstrained", content, max_tokens=1)
    tool = await one_request(client, base_url, wl, "function_tool", content, max_tokens=1)
    if not (plain.ok and tool.ok and plain.prompt_tokens and tool.prompt_tokens):
        raise RuntimeError(f"calibration requests failed: {plain.error} / {tool.error}")
    user = {"role": "user", "content": content}
    offset = plain.prompt_tokens - _prompt_len(tok, [user])  # the server's count vs ours
    target = tool.prompt_tokens - offset
    spec = json.dumps(function_tool(wl.max_tokens)["function"])
    filler = ("# Tools\n\nYou can call this tool, but need not:\n\n" + spec + "\n\n") * 8
    ids = tok(filler, add_special_tokens=False)["input_ids"]
    overhead = _prompt_len(tok, [{"role": "system", "content": ""}, user])
    best: tuple[int, str] | None = None
    for n in range(max(0, target - overhead - 8), min(len(ids), target - overhead + 9)):
        text = tok.decode(ids[:n])
        miss = abs(_prompt_len(tok, [{"role": "system", "content": text}, user]) - target)
        if best is None or miss < best[0]:
            best = (miss, text)
        if miss == 0:
            break
    if best is None:
        raise RuntimeError(f"cannot build a system text for a {target}-token prompt")
    wl.system_text = best[1]
    check = await one_request(client, base_url, wl, "unconstrained_long", content, max_tokens=1)
    return {
        "function_tool_prompt_tokens": tool.prompt_tokens,
        "unconstrained_prompt_tokens": plain.prompt_tokens,
        "unconstrained_long_prompt_tokens": check.prompt_tokens,
        "system_text_chars": len(wl.system_text),
    }


async def run_rounds(base_url: str, prompts: list[str], args: argparse.Namespace, tok: Any) -> dict[str, Any]:
    wl = Workload(args.max_tokens, args.served_name, args.request_timeout)
    per = args.requests_per_round
    n_measured = args.rounds * per
    limits = httpx.Limits(max_connections=args.concurrency + 8, max_keepalive_connections=args.concurrency + 8)
    blocks: list[dict[str, Any]] = []
    by_variant: dict[str, list[Result]] = {v: [] for v in VARIANTS}
    walls: dict[str, float] = {v: 0.0 for v in VARIANTS}
    out: dict[str, Any] = {"blocks": blocks}
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(args.request_timeout, connect=30.0)) as client:
        # Warmup: each variant once (its grammar compiles and is cached), then a few plain
        # requests; warmup prompts sit past the measured ones (their own headers).
        warm_prompts = prompts[len(VARIANTS) * n_measured :]
        out["calibration"] = await calibrate_long_prompt(client, base_url, wl, warm_prompts[-1], tok)
        log(f"[guided] prompt lengths: {out['calibration']}")
        warm = await asyncio.gather(
            *(one_request(client, base_url, wl, v, warm_prompts[i]) for i, v in enumerate(VARIANTS)),
            *(one_request(client, base_url, wl, "unconstrained", warm_prompts[len(VARIANTS) + i]) for i in range(args.warmup)),
        )
        out["warmup"] = [{"ok": r.ok, "error": r.error, "completion_tokens": r.completion_tokens, "finish": r.finish} for r in warm]
        if not all(r.ok for r in warm):
            log(f"[guided] warmup errors: {[r.error for r in warm if not r.ok]}")
        t_start = time.monotonic()
        for r in range(args.rounds):
            if time.monotonic() - t_start > args.time_cap:
                out["hit_time_cap"] = True
                log(f"[guided] time cap {args.time_cap:.0f}s reached after {r} rounds")
                break
            for variant in round_order(r):
                v_index = VARIANTS.index(variant)
                # Variant v, round r, request k gets prompt v * n_measured + r * per + k: the
                # same passage and instruction for every variant, its own header.
                contents = prompts[v_index * n_measured + r * per : v_index * n_measured + (r + 1) * per]
                wall, results = await run_block(client, base_url, wl, variant, contents, args.concurrency)
                tokens = sum(x.completion_tokens for x in results if x.ok)
                blocks.append({
                    "round": r, "variant": variant, "requests": len(results), "ok": sum(x.ok for x in results), "wall_s": round(wall, 3),
                    "completion_tokens": tokens, "output_tok_s": round(tokens / wall, 2) if wall > 0 else None,
                    "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                })  # fmt: skip
                by_variant[variant] += results
                walls[variant] += wall
                log(f"[guided] round {r} {variant}: {blocks[-1]['output_tok_s']} tok/s ({blocks[-1]['ok']}/{len(results)} ok, {wall:.1f}s)")
        out["rounds_completed"] = max((b["round"] for b in blocks), default=-1) + 1
    out["variants"] = {v: summarize(by_variant[v], walls[v], args.max_tokens) for v in VARIANTS}
    add_ratios(out)
    return out


def summarize(results: list[Result], wall: float, max_tokens: int) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    tokens = sum(r.completion_tokens for r in ok)
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            key = (r.error or "unknown")[:160]
            errors[key] = errors.get(key, 0) + 1
    finishes: dict[str, int] = {}
    for r in ok:
        finishes[str(r.finish)] = finishes.get(str(r.finish), 0) + 1
    lat = [r.end - r.start for r in ok]
    ms = lambda x: None if x is None else round(1000.0 * x, 1)  # noqa: E731
    mean = lambda xs: round(statistics.fmean(xs), 1) if xs else None  # noqa: E731
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "error_kinds": errors,
        "wall_s": round(wall, 3),
        "completion_tokens": tokens,
        "output_tok_s": round(tokens / wall, 2) if wall > 0 else None,
        "latency_ms": {"p50": ms(percentile(lat, 50)), "p99": ms(percentile(lat, 99))},
        "short_of_max_tokens": sum(1 for r in ok if r.completion_tokens < max_tokens),
        "finish": finishes,
        "off_format": sum(r.off_format for r in ok),
        "prompt_tokens_mean": mean([r.prompt_tokens for r in ok if r.prompt_tokens is not None]),
        "cached_tokens_mean": mean([r.cached_tokens for r in ok if r.cached_tokens is not None]),
    }


def add_ratios(out: dict[str, Any]) -> None:
    """Per variant: tok/s over unconstrained (`ratio`) and over unconstrained_long
    (`ratio_long`); for a constrained variant, over its BASELINE (`ratio_to_baseline`, the
    figure the 15% target applies to) and the same per round (`round_ratio`)."""
    tok_s = {v: s["output_tok_s"] for v, s in out["variants"].items()}
    per_round: dict[int, dict[str, float]] = {}
    for b in out["blocks"]:
        if b["output_tok_s"] and b["ok"] == b["requests"]:
            per_round.setdefault(b["round"], {})[b["variant"]] = b["output_tok_s"]
    div = lambda a, b: round(a / b, 3) if a and b else None  # noqa: E731
    for v, s in out["variants"].items():
        s["ratio"] = div(tok_s[v], tok_s["unconstrained"])
        s["ratio_long"] = div(tok_s[v], tok_s["unconstrained_long"])
        base = BASELINE.get(v)
        s["baseline"] = base
        s["ratio_to_baseline"] = div(tok_s[v], tok_s[base]) if base else None
        s["meets_target"] = None if s["ratio_to_baseline"] is None else s["ratio_to_baseline"] >= TARGET_RATIO
        rr = sorted(r[v] / r[base] for r in per_round.values() if base and v in r and base in r)
        s["round_ratio"] = {"min": round(rr[0], 3), "median": round(statistics.median(rr), 3), "max": round(rr[-1], 3), "n": len(rr)} if rr else None


# -- report ------------------------------------------------------------------------------------


def _f(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3f}" if abs(x) < 2 else f"{x:.2f}"
    return str(x)


def markdown(result: dict[str, Any]) -> str:
    cfg = result["config"]
    lines = [
        f"### Guided decoding, c={cfg['concurrency']}, {cfg['max_tokens']} output tokens, dtype {result.get('dtype') or '?'}",
        "",
    ]
    run = result.get("run")
    if not run:
        lines.append(f"not measured: {result.get('error')}")
    else:
        lines += [
            "| variant | requests | ok | tok/s | / unconstrained | / unconstrained_long | vs baseline: round min / med / max | meets 0.85 | latency p50 ms | p99 ms | prompt tok | cached tok | short | off-format |",
            "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for v, s in run["variants"].items():
            rr = s.get("round_ratio")
            rr_text = f"{_f(rr['min'])} / {_f(rr['median'])} / {_f(rr['max'])}" if rr else "–"
            mark = lambda base, x: f"**{_f(x)}**" if s.get("baseline") == base else _f(x)  # noqa: E731
            lines.append(
                f"| {v} | {s['requests']} | {s['ok']} | {_f(s['output_tok_s'])} | {mark('unconstrained', s['ratio'])} | {mark('unconstrained_long', s['ratio_long'])} "
                f"| {rr_text} | {_f(s['meets_target'])} | {_f(s['latency_ms']['p50'])} | {_f(s['latency_ms']['p99'])} | {_f(s['prompt_tokens_mean'])} "
                f"| {_f(s['cached_tokens_mean'])} | {s['short_of_max_tokens']} | {s['off_format']} |"
            )
        lines += ["", "Bold: the ratio to the variant's baseline (the same prompt, or one as long), which the 0.85 target applies to."]
        errs = {v: s["error_kinds"] for v, s in run["variants"].items() if s["error_kinds"]}
        if errs:
            lines += ["", f"errors: {json.dumps(errs)[:800]}"]
        if result.get("error"):
            lines += ["", f"error: {result['error'][:500]}"]
    lines += ["", f"load average (1, 5, 15 min) at start {result.get('loadavg_start')}, at end {result.get('loadavg_end')} on {os.cpu_count()} CPUs"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3, help="rounds; each runs every variant once (default 3)")
    p.add_argument("--requests-per-round", type=int, default=16, help="requests per variant per round (default 16)")
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens of every request (default 64)")
    p.add_argument("--prompt-tokens", type=int, default=96, help="tokens of the passage in each user message (default 96)")
    p.add_argument("--warmup", type=int, default=4, help="plain warmup requests, besides one per variant")
    p.add_argument("--time-cap", type=float, default=300.0, help="no round starts after this many seconds of measuring")
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--served-name", default=SERVED_NAME)
    p.add_argument("--server-args", default="", help="extra `switchyard serve` arguments, one shell-quoted string")
    p.add_argument("--quiet-load", type=float, default=None, help="before starting, wait until the 1-min load average is at most this")
    p.add_argument("--quiet-wait", type=float, default=300.0)
    p.add_argument("--out", default=None, help="results JSON (default ops/results/guided-<UTC time>.json)")
    args = p.parse_args(argv)
    if min(args.concurrency, args.rounds, args.requests_per_round, args.max_tokens, args.prompt_tokens) < 1:
        p.error("--concurrency, --rounds, --requests-per-round, --max-tokens and --prompt-tokens must be at least 1")

    out_path, log_dir = start_run(args.out, "guided-")

    model_dir = str(default_model_dir())
    n_prompts = len(VARIANTS) * args.rounds * args.requests_per_round + len(VARIANTS) + args.warmup + 1
    passages = build_prompts(model_dir, n_prompts, args.prompt_tokens, "unique")
    prompts = [p_ + INSTRUCTION for p_ in passages]
    tok = load_tokenizer(model_dir)
    user_lengths = sorted({len(tok(x)["input_ids"]) for x in prompts})

    result: dict[str, Any] = {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": sys.argv[1:] if argv is None else argv,
        "config": {
            "concurrency": args.concurrency, "rounds": args.rounds, "requests_per_round": args.requests_per_round,
            "max_tokens": args.max_tokens, "passage_tokens": args.prompt_tokens, "user_message_tokens": user_lengths,
            "variants": list(VARIANTS), "stream": False, "temperature": 0.0, "target_ratio": TARGET_RATIO,
            "json_schema": people_schema(args.max_tokens), "lark_grammar": patch_grammar(args.max_tokens),
            "example_user_message": prompts[0],
        },  # fmt: skip
        "model_dir": model_dir,
        "served_name": args.served_name,
        "cpu_count": os.cpu_count(),
    }
    if args.quiet_load is not None:
        result["quiet_wait"] = wait_for_quiet(args.quiet_load, args.quiet_wait)
    result["loadavg_start"] = os.getloadavg()
    t0 = time.monotonic()
    server: dict[str, Any] = {}
    result["server"] = server
    try:
        with switchyard_server(log_dir / "switchyard.log", shlex.split(args.server_args), args.startup_timeout) as srv:
            server.update(cmd=srv.cmd, log=str(srv.log_path), startup_s=srv.startup_s, info=srv.info)
            result["dtype"] = srv.dtype(args.served_name)
            result["run"] = asyncio.run(run_rounds(srv.base_url, prompts, args, tok))
    except Exception as e:  # noqa: BLE001 - reported in the results
        result["error"] = f"{type(e).__name__}: {e}"
        log(f"[guided] failed: {result['error'][:2000]}")
    write_results(result, out_path, t0, markdown)


if __name__ == "__main__":
    main()
