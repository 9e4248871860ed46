"""Do image requests stall the text streams beside them? TTFT and tokens/s of image requests, and the text streams' chunk gaps.

    python -m ops.bench.vision [--rounds 3] [--text-concurrency 4] [--image-concurrency 2]
        [--text-requests 8] [--text-tower smollm2|random]
        [--server-args '--dtype float32 --max-num-batched-tokens 128'] [--out F]

Builds a LLaVA in a temporary directory (ops.harness.tiny_vlm: a random CLIP tower of 224x224
pixels, 256 image tokens an image; as its text tower the embedded SmolLM2-135M with its own
weights, SmolVLM-256M's text tower, or with `--text-tower random` a small random Llama; SmolLM2's
tokenizer), starts `switchyard serve --model DIR` on it, sends one unmeasured text and image request, and
runs `--rounds` rounds of two phases, their order alternating from round to round (this 2-core
machine is shared: a phase alone reads the load of the moment, the median of rounds less so):

- `text`: `--text-concurrency` closed-loop streams of 128-token completions asking 64 tokens
  each (ops.harness.load), alone;
- `mixed`: the same text streams, with `--image-concurrency` closed-loop chat streams beside
  them for as long as the text requests last, each with a picture of its own (so the vision
  encoder runs for every one; none is served by the encoder or prefix cache) and a question,
  asking `--image-max-tokens` tokens.

What the load generator does not put on the server's cores (it shares the machine with the
server; a real client does not): every image request's body (a new noise PNG, base64, about
13 ms of CPU each) is built before the phase starts, not at the moment it is sent. And the text
streams ask `skip_special_tokens: false`: a text tower (the random one especially) may emit
special tokens (`<jupyter_code>`, its EOS) mid-stream, which skipped leave a step with no text, a
gap of two steps at the client that is the model's, not the server's.

Per phase: the text streams' tokens/s, TTFT, and the gaps between a stream's chunks (p50,
p99, and the stall ratio p99/p50: the target is at most 2, as for text alone); for the image
requests, TTFT (fetching nothing: the image is a data: URI, decoded at the edge), tokens/s,
and the prompt tokens usage reports (the image's included). The text TTFT and gaps of the
`mixed` phase against the `text` phase say what the images cost the streams. The server's
steps (its debug step log) per phase: their times, those feeding prompt tokens apart (an
image's encoder runs in the step that first feeds its tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import shlex
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from ops.harness.load import OUTPUT_TOKENS, RequestResult, Target, closed_loop, one_request, one_stream, summarize, switchyard_target
from ops.harness.prompts import PROMPT_TOKENS, build_prompts, default_model_dir
from ops.harness.results import cpu_model, log, start_run, wait_for_quiet, write_results
from ops.harness.servers import RunningServer, step_lines, switchyard_server
from ops.harness.stats import ms, percentile, ratio
from ops.harness.tiny_vlm import build_llava, noise_png

SERVED_NAME = "tiny-llava"
QUESTION = "Describe this picture in detail: its colours, its shapes and what it may show."
REQUEST_TIMEOUT = 300.0


def image_body(seed: int, max_tokens: int) -> dict[str, Any]:
    uri = "data:image/png;base64," + base64.b64encode(noise_png(seed)).decode()
    parts = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": uri}}]
    return {
        "model": SERVED_NAME, "messages": [{"role": "user", "content": parts}], "max_tokens": max_tokens, "temperature": 0.0,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
    }  # fmt: skip


def text_target(base_url: str) -> Target:
    """The text streams' target: every token shows as text (the module's docstring says why)."""
    target = switchyard_target(base_url, SERVED_NAME)
    return replace(target, extra_body={**target.extra_body, "skip_special_tokens": False})


async def phase(srv: RunningServer, prompts: list[str], args: argparse.Namespace, bodies: list[dict[str, Any]] | None, seed0: int) -> dict[str, Any]:
    """One phase: the text streams (and, given image `bodies`, the image streams beside them;
    past those, a body is built as it is sent)."""
    images = bodies is not None
    bodies = bodies or []
    target = text_target(srv.base_url)
    chat_url = srv.base_url + "/v1/chat/completions"
    text_done = False
    async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=64)) as client:

        async def text(i: int) -> RequestResult:
            return await one_request(client, target, prompts[i], OUTPUT_TOKENS, REQUEST_TIMEOUT)

        async def image(i: int) -> RequestResult:
            body = bodies[i] if i < len(bodies) else image_body(seed0 + i, args.image_max_tokens)
            return await one_stream(client, chat_url, body, REQUEST_TIMEOUT)

        async def texts() -> tuple[list[RequestResult], int]:
            nonlocal text_done
            try:
                return await closed_loop(args.text_concurrency, len(prompts), text)
            finally:
                text_done = True

        async def image_loop() -> tuple[list[RequestResult], int]:
            results: list[RequestResult] = []

            async def worker(k: int) -> None:
                i = k
                while not text_done:
                    results.append(await image(i))
                    i += args.image_concurrency

            await asyncio.gather(*(worker(k) for k in range(args.image_concurrency)))
            return results, len(results)

        t0 = time.perf_counter()
        if images:
            (text_results, _), (image_results, _) = await asyncio.gather(texts(), image_loop())
        else:
            (text_results, _), image_results = await texts(), []
    out: dict[str, Any] = {"text": _summary(text_results, t0, PROMPT_TOKENS, OUTPUT_TOKENS)}
    if images:
        out["images"] = _summary(image_results, t0, None, args.image_max_tokens)
        out["images"]["prompt_tokens"] = sorted({r.usage_prompt_tokens for r in image_results if r.usage_prompt_tokens is not None})
    return out


def _summary(results: list[RequestResult], t0: float, prompt_tokens: int | None, max_tokens: int) -> dict[str, Any]:
    wall = max((r.end for r in results), default=t0) - t0
    s = summarize(results, wall, prompt_tokens, max_tokens)
    gaps = s["itl_chunk_ms"]
    s["stall_ratio"] = ratio(gaps["p99"], gaps["p50"], 2)
    return s


def one_round(srv: RunningServer, prompts: list[str], args: argparse.Namespace, round_no: int) -> dict[str, Any]:
    """Both phases, `text` first in even rounds; each on text prompts of its own."""
    out: dict[str, Any] = {"round": round_no}
    order = [("text", False), ("mixed", True)] if round_no % 2 == 0 else [("mixed", True), ("text", False)]
    _, offset = step_lines(srv.log_path, 0)
    for k, (name, images) in enumerate(order):
        first = (2 * round_no + k) * args.text_requests
        seed0 = 1000 * (2 * round_no + k)
        # Before the quiet wait: more than a phase sends at the defaults (6-8).
        bodies = [image_body(seed0 + i, args.image_max_tokens) for i in range(2 * args.text_requests)] if images else None
        quiet = wait_for_quiet(args.max_load, 60)
        _, offset = step_lines(srv.log_path, offset)
        out[name] = asyncio.run(phase(srv, prompts[first : first + args.text_requests], args, bodies, seed0))
        steps, offset = step_lines(srv.log_path, offset)
        out[name].update(machine_load=quiet, server_steps=step_summary(steps))
        log(f"[round {round_no} {name}] text {out[name]['text']['output_tok_s']} tok/s, stall {out[name]['text']['stall_ratio']}, load {quiet['load1']:.2f}")
    return out


def median_phase(phases: list[dict[str, Any]]) -> dict[str, Any]:
    def med(values: list[Any]) -> float | None:
        kept = [v for v in values if v is not None]
        return round(statistics.median(kept), 2) if kept else None

    out: dict[str, Any] = {
        "text_tok_s": med([p["text"]["output_tok_s"] for p in phases]),
        "text_ttft_p50_ms": med([p["text"]["ttft_ms"]["p50"] for p in phases]),
        "text_gap_p50_ms": med([p["text"]["itl_chunk_ms"]["p50"] for p in phases]),
        "text_gap_p99_ms": med([p["text"]["itl_chunk_ms"]["p99"] for p in phases]),
        "text_stall_ratio": med([p["text"]["stall_ratio"] for p in phases]),
        "step_max_ms": med([p["server_steps"]["step_ms"]["max"] for p in phases]),
        "encoder_slice_max_ms": med([p["server_steps"]["encoder_ms"]["max"] for p in phases]),
    }
    if "images" in phases[0]:
        out |= {
            "image_requests": sum(p["images"]["ok"] for p in phases),
            "image_ttft_p50_ms": med([p["images"]["ttft_ms"]["p50"] for p in phases]),
            "image_ttft_p99_ms": med([p["images"]["ttft_ms"]["p99"] for p in phases]),
            "image_tok_s": med([p["images"]["output_tok_s"] for p in phases]),
            "image_prompt_tokens": phases[0]["images"]["prompt_tokens"],
        }
    return out


def step_summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The server's steps in a phase (its debug step log): how long they took, those feeding
    prompt tokens apart, and those that ran vision encoder work (an image's encoder runs ahead
    of its tokens, in slices over several steps while requests stream) with its share."""
    every = [s["ms"] / 1e3 for s in steps]
    prefill = [s["ms"] / 1e3 for s in steps if s["prompt_tokens"]]
    encoding = [s for s in steps if s.get("encoder_ms")]
    return {
        "steps": len(steps),
        "step_ms": {"p50": ms(percentile(every, 50)), "p99": ms(percentile(every, 99)), "max": ms(max(every)) if every else None},
        "prefill_steps": len(prefill),
        "prefill_step_ms": {"p50": ms(percentile(prefill, 50)), "max": ms(max(prefill)) if prefill else None},
        "encoder_steps": len(encoding),
        "encoder_step_ms": {"max": max(s["ms"] for s in encoding) if encoding else None},
        "encoder_ms": {"p50": ms(percentile([s["encoder_ms"] / 1e3 for s in encoding], 50)), "max": max(s["encoder_ms"] for s in encoding) if encoding else None},
    }


async def warm_up(srv: RunningServer, prompt: str, args: argparse.Namespace) -> None:
    async with httpx.AsyncClient(timeout=None) as client:
        await one_request(client, text_target(srv.base_url), prompt, 8, REQUEST_TIMEOUT)
        await one_stream(client, srv.base_url + "/v1/chat/completions", image_body(10_000, 4), REQUEST_TIMEOUT)


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"text c={result['text_concurrency']}, images c={result['image_concurrency']}, {result['rounds_run']} rounds, server args `{result['server_args']}`, CPU {result['cpu']}",
        "",
        "| round | phase | load1 | text tok/s | text TTFT p50 ms | text gap p50 ms | text gap p99 ms | stall p99/p50 | max step ms | max encoder slice ms | images | image TTFT p50 ms | image TTFT p99 ms | image tok/s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rounds"]:
        for name in ("text", "mixed"):
            p = r[name]
            t, im = p["text"], p.get("images") or {}
            lines.append(
                f"| {r['round']} | {name} | {p['machine_load']['load1']:.2f} | {t['output_tok_s']} | {t['ttft_ms']['p50']} | {t['itl_chunk_ms']['p50']} | {t['itl_chunk_ms']['p99']} "
                f"| {t['stall_ratio']} | {p['server_steps']['step_ms']['max']} | {p['server_steps']['encoder_ms']['max'] or ''} | {im.get('ok', '')} | {(im.get('ttft_ms') or {}).get('p50', '')} "
                f"| {(im.get('ttft_ms') or {}).get('p99', '')} | {im.get('output_tok_s', '')} |"
            )
    for name in ("text", "mixed"):
        m = result["median"][name]
        lines.append(
            f"| **median** | {name} | | {m['text_tok_s']} | {m['text_ttft_p50_ms']} | {m['text_gap_p50_ms']} | {m['text_gap_p99_ms']} | **{m['text_stall_ratio']}** "
            f"| {m['step_max_ms']} | {m['encoder_slice_max_ms'] or ''} | {m.get('image_requests', '')} | {m.get('image_ttft_p50_ms', '')} | {m.get('image_ttft_p99_ms', '')} | {m.get('image_tok_s', '')} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text-concurrency", type=int, default=4)
    p.add_argument("--image-concurrency", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--text-requests", type=int, default=8, help="text requests per phase")
    p.add_argument("--image-max-tokens", type=int, default=32)
    p.add_argument(
        "--text-tower", choices=("smollm2", "random"), default="smollm2",
        help="the LLaVA's text tower: a small random Llama (6 x 512), or the embedded SmolLM2-135M with its weights (30 x 576: SmolVLM-256M's text tower)",
    )  # fmt: skip
    p.add_argument("--server-args", default="--dtype float32 --max-num-batched-tokens 128", help="`switchyard serve` arguments, one shell-quoted string")
    p.add_argument("--max-load", type=float, default=2.5, help="wait (up to 120 s) before each phase until the 1-minute load average is at most this")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out_path, log_dir = start_run(args.out, "vision-")
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="switchyard-vision-bench-") as tmp:
        model_dir = build_llava(Path(tmp) / "llava", default_model_dir(), text_weights=args.text_tower == "smollm2")
        prompts = build_prompts(model_dir, 2 * args.rounds * args.text_requests + 1, PROMPT_TOKENS, "unique")
        server_args = ["--model", str(model_dir), "--served-name", SERVED_NAME, "--no-embeddings", "--log-level", "debug", *shlex.split(args.server_args)]
        with switchyard_server(log_dir / "server.log", server_args, args.startup_timeout) as srv:
            asyncio.run(warm_up(srv, prompts[-1], args))
            rounds = [one_round(srv, prompts, args, r) for r in range(args.rounds)]
    result: dict[str, Any] = {
        "bench": "vision",
        "text_concurrency": args.text_concurrency,
        "image_concurrency": args.image_concurrency,
        "text_requests": args.text_requests,
        "rounds_run": args.rounds,
        "image_max_tokens": args.image_max_tokens,
        "server_args": args.server_args,
        "model": "LLaVA (ops.harness.tiny_vlm): random CLIP 224px/14 (256 image tokens), 6 layers x 384; "
        + ("SmolLM2-135M's own weights as the text tower (30 layers x 576)" if args.text_tower == "smollm2" else "random Llama 6 layers x 512")
        + "; SmolLM2 tokenizer",
        "text_tower": args.text_tower,
        "cpu": cpu_model(),
        "rounds": rounds,
        "median": {name: median_phase([r[name] for r in rounds]) for name in ("text", "mixed")},
    }
    write_results(result, out_path, started, markdown)


if __name__ == "__main__":
    main()
