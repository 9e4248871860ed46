"""How many inputs/s does /v1/embeddings serve at batch 1, 16 and 64, against the bare model?

    python -m ops.bench.embeddings [--batches 1,16,64] [--clients 4] [--inputs 1024] [--out ops/results/NAME.json]

What it measures.
1. bare forward (ops.bench.bare_embeddings, in a subprocess with a timeout): the same model
   (all-MiniLM-L6-v2, float32) with transformers' AutoModel + mean pooling + L2 normalization,
   batch B at a time over the same texts in the same order, tokenization included. It runs
   with 1 and with 2 torch threads (`--bare-threads`) and keeps the faster per B: on a shared
   2-core machine, 2 OpenMP threads can be many times slower than 1 (a barrier waits on a
   descheduled thread), and the baseline is meant as a ceiling.
2. `switchyard serve` (its defaults: the chat model plus the default embedding model
   `all-minilm-l6-v2`, which the server runs in float32) on a free loopback port. For each batch
   size B: `--clients` workers, closed loop (each keeps one request in flight), each request a
   POST /v1/embeddings with `input` a list of B texts, until `--inputs` inputs (rounded up to
   whole requests) are sent or `--time-cap` passes. One unmeasured request per client first.

The texts: `--texts` (512) distinct English sentences, one or two per input, built from
fixed word lists with a seeded RNG (`--seed`, ops.harness.prompts.build_texts; the JSON
holds their token-length statistics); request k at batch B sends texts k*B .. k*B+B-1 (mod
the pool), and the bare run's batch k is the same texts.

How to read it. `inputs_s` = inputs of the successful requests / the batch size's wall time
(first send to last response). `latency_ms` p50/p99 is per request (send to full response).
`ratio` = server inputs/s / bare inputs/s at the same B: the server's figure includes HTTP,
JSON of 384 floats per input, tokenization in its actor and its own batching (the embedding
scheduler packs waiting inputs into steps of at most 8192 tokens, `max_num_batched_tokens_embed`,
so a 64-input request runs as one step, padded to its longest input like the bare loop's), and
the client shares the machine's cores. `max_cosine_distance` compares the
server's vectors with the bare run's for the first texts (1 - cosine; near 0 expected).
Load averages at start and end are in the JSON; with a 1-minute load above ~1 at the start,
do not compare runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ops.harness.load import closed_loop, parse_levels
from ops.harness.processes import json_from_subprocess
from ops.harness.prompts import batch_texts, build_texts, embedding_model_dir
from ops.harness.results import REPO_ROOT, fmt, loadavg_line, log, start_run, utc_now, wait_for_quiet, write_results
from ops.harness.servers import switchyard_server
from ops.harness.stats import error_kinds, ms, percentile

SERVED_NAME = "all-minilm-l6-v2"


# -- the server --------------------------------------------------------------------------------


@dataclass
class Result:
    ok: bool = False
    error: str | None = None
    start: float = 0.0
    end: float = 0.0
    inputs: int = 0
    prompt_tokens: int = 0


async def one_request(client: httpx.AsyncClient, url: str, inputs: list[str], encoding_format: str, timeout: float) -> tuple[Result, list[Any]]:
    """One embeddings request; never raises. Returns the result and the response's vectors."""
    res = Result(start=time.perf_counter())
    vectors: list[Any] = []
    try:
        async with asyncio.timeout(timeout):
            resp = await client.post(url, json={"model": SERVED_NAME, "input": inputs, "encoding_format": encoding_format})
        res.end = time.perf_counter()
        if resp.status_code != 200:
            res.error = f"HTTP {resp.status_code}: {resp.text[:300]}"
            return res, vectors
        body = resp.json()
        data = body.get("data") or []
        if len(data) != len(inputs) or [d.get("index") for d in data] != list(range(len(inputs))):
            res.error = f"{len(data)} embeddings for {len(inputs)} inputs (or out of order)"
            return res, vectors
        vectors = [d["embedding"] for d in data]
        res.inputs = len(data)
        res.prompt_tokens = (body.get("usage") or {}).get("prompt_tokens") or 0
        res.ok = True
    except TimeoutError:
        res.error = f"timeout after {timeout:.0f}s"
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    if not res.end:
        res.end = time.perf_counter()
    return res, vectors


async def run_batch_size(client: httpx.AsyncClient, url: str, texts: list[str], b: int, args: argparse.Namespace) -> dict[str, Any]:
    n_requests = max(args.clients, -(-args.inputs // b))
    # Warmup: one request per client at this shape (texts from the far end of the pool).
    await asyncio.gather(*(one_request(client, url, batch_texts(texts[::-1], b, i), args.encoding_format, args.request_timeout) for i in range(args.clients)))
    t0 = time.perf_counter()

    async def send(k: int) -> Result:
        return (await one_request(client, url, batch_texts(texts, b, k), args.encoding_format, args.request_timeout))[0]

    async with asyncio.timeout(args.time_cap + args.request_timeout + 30):
        results, issued = await closed_loop(args.clients, n_requests, send, deadline=t0 + args.time_cap)
    wall = max((r.end for r in results), default=t0) - t0
    ok = [r for r in results if r.ok]
    lat = [r.end - r.start for r in ok]
    inputs = sum(r.inputs for r in ok)
    return {
        "batch": b,
        "clients": args.clients,
        "requests": len(results),
        "requests_planned": n_requests,
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "error_kinds": error_kinds(results),
        "inputs": inputs,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "wall_s": round(wall, 3),
        "inputs_s": round(inputs / wall, 2) if wall > 0 else None,
        "req_s": round(len(ok) / wall, 2) if wall > 0 else None,
        "latency_ms": {"p50": ms(percentile(lat, 50), 1), "p99": ms(percentile(lat, 99), 1), "mean": ms(statistics.fmean(lat), 1) if lat else None},
        "hit_time_cap": issued < n_requests,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }


def _cosine_distance(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    return 1.0 - dot / (na * nb) if na and nb else 1.0


async def run_server(base_url: str, texts: list[str], args: argparse.Namespace, check_vectors: list[list[float]] | None) -> dict[str, Any]:
    url = base_url + "/v1/embeddings"
    limits = httpx.Limits(max_connections=args.clients + 4, max_keepalive_connections=args.clients + 4)
    out: dict[str, Any] = {"levels": []}
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(args.request_timeout, connect=30.0)) as client:
        if check_vectors:
            res, vectors = await one_request(client, url, texts[: len(check_vectors)], "float", args.request_timeout)
            out["check"] = (
                {"texts": len(vectors), "max_cosine_distance": max(_cosine_distance(a, b) for a, b in zip(vectors, check_vectors))}
                if res.ok
                else {"error": res.error}
            )
        for b in args.batches:
            level = await run_batch_size(client, url, texts, b, args)
            out["levels"].append(level)
            log(f"[embeddings] B={b}: {level['inputs_s']} inputs/s, latency p50 {level['latency_ms']['p50']} ms, errors {level['errors']}")
    return out


# -- the bare baseline -------------------------------------------------------------------------


def run_bare(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """ops.bench.bare_embeddings in a subprocess with a timeout (hub off): its JSON, or {"error"}."""
    tmp = out_dir / f".bare-embeddings-{os.getpid()}.json.tmp"
    cmd = [
        sys.executable, "-m", "ops.bench.bare_embeddings", "--batches", ",".join(map(str, args.batches)), "--inputs", str(args.inputs),
        "--time-cap", str(args.time_cap), "--texts", str(args.texts), "--seed", str(args.seed), "--threads", ",".join(map(str, args.bare_threads)), "--out", str(tmp),
    ]  # fmt: skip
    return json_from_subprocess("bare forward", cmd, tmp, REPO_ROOT, args.bare_timeout, env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


# -- report ------------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    bare = (result.get("bare_forward") or {}).get("best") or {}
    server = result.get("switchyard") or {}
    levels = {lv["batch"]: lv for lv in server.get("levels", [])}
    lines = [
        f"### Embeddings ({SERVED_NAME}, float32): inputs/s, {result['config']['clients']} clients closed loop",
        "",
        "| batch | Switchyard inputs/s | latency p50 ms | latency p99 ms | requests | errors | bare inputs/s (threads) | bare forward-only inputs/s | Switchyard / bare |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in result["config"]["batches"]:
        lv, br = levels.get(b, {}), bare.get(str(b), {})
        lines.append(
            f"| {b} | {fmt(lv.get('inputs_s'))} | {fmt((lv.get('latency_ms') or {}).get('p50'))} | {fmt((lv.get('latency_ms') or {}).get('p99'))} "
            f"| {fmt(lv.get('requests'))} | {fmt(lv.get('errors'))} | {fmt(br.get('inputs_s'))} ({fmt(br.get('threads'))}) | {fmt(br.get('forward_inputs_s'))} "
            f"| {fmt((result.get('ratios') or {}).get(str(b)))} |"
        )
    lines.append("")
    check = server.get("check")
    if check:
        lines.append(f"server vs bare vectors: {json.dumps(check)}")
    for key in ("bare_forward", "switchyard"):
        err = (result.get(key) or {}).get("error")
        if err:
            lines.append(f"{key} error: {err[:500]}")
    lines.append(f"texts: {result['texts']['count']} distinct, tokens per input min/mean/max {result['texts']['tokens']}")
    lines.append(loadavg_line(result))
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=parse_levels, default=[1, 16, 64], help="inputs per request (default 1,16,64)")
    p.add_argument("--clients", type=int, default=4, help="concurrent closed-loop clients (default 4)")
    p.add_argument("--inputs", type=int, default=1024, help="inputs per batch size, rounded up to whole requests (default 1024)")
    p.add_argument("--time-cap", type=float, default=25.0, help="seconds per batch size (and bare thread count) after which no new request (or bare batch) starts")
    p.add_argument("--texts", type=int, default=512, help="distinct texts in the pool (default 512)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--encoding-format", choices=["float", "base64"], default="float")
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--server-args", default="", help="extra `switchyard serve` arguments, one shell-quoted string")
    p.add_argument("--skip-bare", action="store_true")
    p.add_argument("--bare-threads", type=parse_levels, default=[1, 2], help="intra-op thread counts the bare run tries; the faster counts (default 1,2)")
    p.add_argument("--bare-timeout", type=float, default=400.0)
    p.add_argument("--check", type=int, default=4, help="texts whose server vectors are compared with the bare run's")
    p.add_argument("--quiet-load", type=float, default=None, help="before each section, wait until the 1-min load average is at most this")
    p.add_argument("--quiet-wait", type=float, default=300.0)
    p.add_argument("--out", default=None, help="results JSON (default ops/results/embeddings-<UTC time>.json)")
    args = p.parse_args(argv)
    if min(args.clients, args.inputs, args.texts) < 1:
        p.error("--clients, --inputs and --texts must be at least 1")
    return args


def _head(args: argparse.Namespace, argv: list[str] | None, model_dir: Path, texts: list[str]) -> dict[str, Any]:
    """The run's config, model and texts (with their token-length statistics)."""
    from transformers import AutoTokenizer

    lengths = [len(ids) for ids in AutoTokenizer.from_pretrained(str(model_dir))(texts)["input_ids"]]
    return {
        "started_utc": utc_now(),
        "argv": sys.argv[1:] if argv is None else argv,
        "config": {
            "batches": args.batches, "clients": args.clients, "inputs_per_batch_size": args.inputs, "time_cap_s": args.time_cap,
            "encoding_format": args.encoding_format, "seed": args.seed,
        },  # fmt: skip
        "model_dir": str(model_dir),
        "served_name": SERVED_NAME,
        "texts": {"count": len(texts), "tokens": [min(lengths), round(statistics.fmean(lengths), 1), max(lengths)], "examples": texts[:3]},
        "cpu_count": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
    }


def _switchyard(args: argparse.Namespace, log_dir: Path, texts: list[str], check_vectors: list[list[float]] | None) -> dict[str, Any]:
    """The server's section: start it, every batch size, stop it; a failure is reported in it."""
    section: dict[str, Any] = {}
    try:
        with switchyard_server(log_dir / "switchyard.log", shlex.split(args.server_args), args.startup_timeout) as srv:
            section.update(cmd=srv.cmd, log=str(srv.log_path), startup_s=srv.startup_s, info=srv.info, dtype=srv.dtype(SERVED_NAME))
            section.update(asyncio.run(run_server(srv.base_url, texts, args, check_vectors[: args.check] if check_vectors else None)))
    except Exception as e:  # noqa: BLE001 - reported in the results
        section["error"] = f"{type(e).__name__}: {e}"
        log(f"[embeddings] failed: {section['error'][:2000]}")
    return section


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out_path, log_dir = start_run(args.out, "embeddings-")
    texts = build_texts(args.texts, args.seed)
    result = _head(args, argv, embedding_model_dir(), texts)
    t0 = time.monotonic()
    waits: dict[str, Any] = {}
    if not args.skip_bare:
        if args.quiet_load is not None:
            waits["bare_forward"] = wait_for_quiet(args.quiet_load, args.quiet_wait)
        result["bare_forward"] = run_bare(args, out_path.parent)
    check_vectors = (result.get("bare_forward") or {}).get("check_vectors")
    if args.quiet_load is not None:
        waits["switchyard"] = wait_for_quiet(args.quiet_load, args.quiet_wait)
    result["switchyard"] = section = _switchyard(args, log_dir, texts, check_vectors)
    if waits:
        result["quiet_waits"] = waits
    if "bare_forward" in result:
        result["bare_forward"].pop("check_vectors", None)  # compared above; not worth keeping
    bare = (result.get("bare_forward") or {}).get("best") or {}
    result["ratios"] = {
        str(lv["batch"]): round(lv["inputs_s"] / bare[str(lv["batch"])]["inputs_s"], 3)
        for lv in section.get("levels", [])
        if lv.get("inputs_s") and (bare.get(str(lv["batch"])) or {}).get("inputs_s")
    }
    write_results(result, out_path, t0, markdown)


if __name__ == "__main__":
    main()
