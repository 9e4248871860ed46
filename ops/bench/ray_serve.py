"""What does Ray Serve add to one replica, and does prefix routing beat power of two?
`switchyard serve-ray` against plain `switchyard serve`.

    PYTHONPATH=$PWD python -m ops.bench.ray_serve [--levels 1,16] [--topology direct|relay] [--split] [--skip-overhead] [--skip-routing] [--out PATH]

1. Overhead (one run, same machine, same model, same threads): `switchyard serve` and then
   `switchyard serve-ray --replicas 1 --topology T` (a local Ray instance; --topology direct:
   HTTP proxy -> the replica; relay: HTTP proxy -> ingress -> the replica), each under the
   streaming load sweep of ops.harness.load (128-token unique prompts,
   64 tokens out), alternated for --rounds rounds. Reported as ratios (medians over rounds):
   tok/s at c=16 (Ray / plain) and TTFT p50 at c=1 (Ray - plain, ms). Targets: at most 10%
   lower throughput, at most 20 ms added TTFT. With --split the two servers are serve-ray and
   serve-ray --engine-process (each replica's scheduler and executor in a process of its own):
   whether the split pays inside a replica.
   Then the added TTFT alone, paired: both servers up at once and one request at a time to
   each in turn (--pairs), so each pair sees the same machine load; the median difference.
2. Routing quality: `serve-ray --replicas 2` with `--router prefix`, then with `--router pow2`
   (Ray Serve's power of two choices, which serve-ray deploys on the direct topology: the
   proxy calls the replicas), each on cold caches, under the multi-tenant
   shared-prefix chat mix of ops.harness.prefix_mix (streamed, so TTFT is measured): the
   prefix-cache hit rate (cached / prompt tokens) and TTFT p50/p99. The KV cache is capped
   (--kv-blocks per replica) so that one replica cannot hold every tenant's system prompt but
   holds half of them: the case routing is for. Two replicas on a 2-core machine cannot show
   scale-out throughput (they share the cores), so this section measures routing quality only.

Writes one JSON (ops/results/ray-<UTC>.json) and prints a markdown table. Run it alone
on a quiet machine: never beside another benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from ops.harness.load import OUTPUT_TOKENS, one_request, parse_levels, prompts_needed, sweep, switchyard_target
from ops.harness.prefix_mix import HitRate, requests
from ops.harness.prompts import PROMPT_TOKENS, build_prompts, default_model_dir
from ops.harness.results import cpu_model, log, start_run, write_results
from ops.harness.servers import DEFAULT_SERVED_NAME, switchyard_server
from ops.harness.stats import ms, percentile

SERVED = DEFAULT_SERVED_NAME


def overhead(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    n_prompts = prompts_needed(args.levels, args.requests_per_slot, args.min_requests, args.warmup)
    prompts = build_prompts(str(default_model_dir()), n_prompts, PROMPT_TOKENS, "unique")
    common = ["--no-embeddings", "--num-threads", str(args.threads), "--log-level", "warning"]
    kwargs = dict(max_tokens=OUTPUT_TOKENS, requests_per_slot=args.requests_per_slot, min_requests=args.min_requests,
                  warmup_requests=args.warmup, expected_prompt_tokens=PROMPT_TOKENS)  # fmt: skip
    rounds: list[dict[str, Any]] = []
    servers = split_servers(args) if args.split else (("plain", "serve", PLAIN_ARGS), ("ray", "serve-ray", ray_args(args)))
    for i in range(args.rounds):  # alternated, so drift in the machine's load hits both alike
        current: dict[str, Any] = {}
        for name, command, extra in servers:
            with switchyard_server(log_dir / f"{name}-{i}.log", [*common, *extra], args.startup_timeout, command=command) as srv:
                current[name] = {"cmd": srv.cmd, "startup_s": srv.startup_s}
                current[name]["sweep"] = asyncio.run(sweep(switchyard_target(srv.base_url, SERVED), prompts, args.levels, **kwargs))
        current["ratios"] = overhead_ratios(current, servers[0][0], servers[1][0])
        log(f"[overhead round {i}] {current['ratios']}")
        rounds.append(current)
    ratios = {key: round(statistics.median(r["ratios"][key] for r in rounds if key in r["ratios"]), 3) for key in rounds[0]["ratios"]}
    return {"rounds": rounds, "ratios": ratios, "threads": args.threads, "topology": args.topology, "servers": [name for name, _, _ in servers]}


PLAIN_ARGS: list[str] = []


def split_servers(args: argparse.Namespace) -> tuple[tuple[str, str, list[str]], ...]:
    """--split: the replica with its engine in the replica's process, then in its own."""
    return (("ray", "serve-ray", ray_args(args)), ("ray_split", "serve-ray", [*ray_args(args), "--engine-process"]))


def ray_args(args: argparse.Namespace) -> list[str]:
    return ["--replicas", "1", "--ingress-replicas", "1", "--replica-cpus", "1", "--topology", args.topology]


def paired_ttft(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """Both servers up at once, one request at a time to each in turn: the added TTFT with
    the machine's drift cancelled (each pair runs under the same load)."""
    prompts = build_prompts(str(default_model_dir()), args.pairs + 2, PROMPT_TOKENS, "unique")
    common = ["--no-embeddings", "--num-threads", str(args.threads), "--log-level", "warning"]
    with (
        switchyard_server(log_dir / "paired-plain.log", [*common, *PLAIN_ARGS], args.startup_timeout) as plain,
        switchyard_server(log_dir / "paired-ray.log", [*common, *ray_args(args)], args.startup_timeout, command="serve-ray") as ray,
    ):
        targets = [switchyard_target(plain.base_url, SERVED), switchyard_target(ray.base_url, SERVED)]

        async def run() -> list[tuple[float, float]]:
            pairs: list[tuple[float, float]] = []
            async with httpx.AsyncClient(timeout=300) as client:
                for i, prompt in enumerate(prompts):
                    order = targets if i % 2 == 0 else targets[::-1]  # neither always goes first
                    got = {t.base_url: await one_request(client, t, prompt, 4, 300) for t in order}
                    a, b = got[targets[0].base_url], got[targets[1].base_url]
                    if i >= 2 and a.ok and b.ok and a.ttft is not None and b.ttft is not None:  # the first two warm both up
                        pairs.append((a.ttft, b.ttft))
            return pairs

        pairs = asyncio.run(run())
    diffs = [b - a for a, b in pairs]
    return {"pairs": len(pairs), "topology": args.topology, "plain_ttft_p50_ms": ms(percentile([a for a, _ in pairs], 50)), "ray_ttft_p50_ms": ms(percentile([b for _, b in pairs], 50)),
            "added_ttft_p50_ms": ms(percentile(diffs, 50)), "added_ttft_p90_ms": ms(percentile(diffs, 90))}  # fmt: skip


def _level(section: dict[str, Any], c: int) -> dict[str, Any] | None:
    return next((lv for lv in section["sweep"]["levels"] if lv["concurrency"] == c), None)


def overhead_ratios(result: dict[str, Any], first: str = "plain", second: str = "ray") -> dict[str, Any]:
    """The second server over the first: tok/s at the highest level, TTFT p50 added at c=1."""
    plain, ray = result[first], result[second]
    out: dict[str, Any] = {}
    hi = max(plain["sweep"]["config"]["levels"])
    p_hi, r_hi, p_1, r_1 = _level(plain, hi), _level(ray, hi), _level(plain, 1), _level(ray, 1)
    if p_hi and r_hi and p_hi["output_tok_s"] and r_hi["output_tok_s"]:
        out[f"tok_s_ratio_c{hi}"] = round(r_hi["output_tok_s"] / p_hi["output_tok_s"], 3)
    if p_1 and r_1 and p_1["ttft_ms"]["p50"] is not None and r_1["ttft_ms"]["p50"] is not None:
        out["ttft_p50_added_ms_c1"] = round(r_1["ttft_ms"]["p50"] - p_1["ttft_ms"]["p50"], 2)
    return out


async def run_mix(base_url: str, args: argparse.Namespace) -> dict[str, Any]:
    bodies = iter(requests(args.tenants, args.mix_requests, args.system_words, seed=1, model=SERVED, max_tokens=8))
    hits, errors = HitRate(), 0
    ttfts: list[float] = []
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as http:

        async def worker() -> None:
            nonlocal errors
            for body in bodies:
                body = {**body, "stream": True, "stream_options": {"include_usage": True}}
                t0 = time.perf_counter()
                first = None
                async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                    if r.status_code != 200:
                        errors += 1
                        continue
                    async for line in r.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        chunk = json.loads(line[6:])
                        if first is None and any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                            first = time.perf_counter() - t0
                        if chunk.get("usage"):
                            hits.add(chunk["usage"])
                if first is not None:
                    ttfts.append(first)

        await asyncio.gather(*(worker() for _ in range(args.mix_concurrency)))
    return {"requests": hits.requests, "errors": errors, "wall_s": round(time.perf_counter() - started, 2), "hit_rate": round(hits.rate, 4),
            "cached_tokens": hits.cached_tokens, "prompt_tokens": hits.prompt_tokens,
            "ttft_ms": {"p50": ms(percentile(ttfts, 50), 1), "p99": ms(percentile(ttfts, 99), 1)}}  # fmt: skip


def routing(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"tenants": args.tenants, "requests": args.mix_requests, "concurrency": args.mix_concurrency,
                           "system_words": args.system_words, "kv_blocks_per_replica": args.kv_blocks}  # fmt: skip
    for router in ("prefix", "pow2"):
        extra = ["--replicas", "2", "--ingress-replicas", "1", "--replica-cpus", "0.5", "--router", router,
                 "--no-embeddings", "--num-threads", "1", "--num-kv-blocks", str(args.kv_blocks), "--log-level", "warning"]  # fmt: skip
        with switchyard_server(log_dir / f"routing-{router}.log", extra, args.startup_timeout, command="serve-ray") as srv:
            out[router] = asyncio.run(run_mix(srv.base_url, args))
            log(f"[routing {router}] {out[router]}")
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [f"CPU: {result['cpu']} ({result['cpu_count']} cores)", ""]
    if "overhead" in result:
        lines += ["| round | server | c | tok/s | TTFT p50 ms | TTFT p99 ms | errors |", "|---|---|---|---|---|---|---|"]
        for i, current in enumerate(result["overhead"]["rounds"]):
            for name in result["overhead"].get("servers", ("plain", "ray")):
                for lv in current[name]["sweep"]["levels"]:
                    lines.append(f"| {i} | {name} | {lv['concurrency']} | {lv['output_tok_s']} | {lv['ttft_ms']['p50']} | {lv['ttft_ms']['p99']} | {lv['errors']} |")
        lines += ["", f"ratios (median over rounds, topology {result['overhead'].get('topology')}): {json.dumps(result['overhead']['ratios'])}", ""]
    if "paired_ttft" in result:
        lines += [f"paired TTFT (both servers up, requests alternated, 4 tokens out): {json.dumps(result['paired_ttft'])}", ""]
    if "routing" in result:
        r = result["routing"]
        lines += [f"shared-prefix mix: {r['tenants']} tenants, {r['requests']} requests, c={r['concurrency']}, {r['kv_blocks_per_replica']} KV blocks per replica",
                  "| router | hit rate | TTFT p50 ms | TTFT p99 ms | errors |", "|---|---|---|---|---|"]  # fmt: skip
        for router in ("prefix", "pow2"):
            x = r[router]
            lines.append(f"| {router} | {x['hit_rate']:.1%} | {x['ttft_ms']['p50']} | {x['ttft_ms']['p99']} | {x['errors']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", type=parse_levels, default=[1, 16], help="overhead sweep levels (default 1,16: TTFT at c=1, tok/s at c=16)")
    p.add_argument("--requests-per-slot", type=int, default=4)
    p.add_argument("--min-requests", type=int, default=16)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--topology", choices=["direct", "relay"], default="direct",
                   help="the one-replica deployment's shape in the overhead and paired runs (api/cluster/deploy.py)")  # fmt: skip
    p.add_argument("--threads", type=int, default=2, help="torch threads of the (one) model replica in the overhead runs")
    p.add_argument("--rounds", type=int, default=3, help="overhead runs, plain and Ray alternated; ratios are the median round's")
    p.add_argument("--pairs", type=int, default=100, help="paired TTFT requests (both servers up at once); 0 skips it")
    p.add_argument("--tenants", type=int, default=32)
    p.add_argument("--system-words", type=int, default=200, help="words per tenant system prompt (~240 tokens on SmolLM2)")
    p.add_argument("--mix-requests", type=int, default=256)
    p.add_argument("--mix-concurrency", type=int, default=4)
    p.add_argument("--kv-blocks", type=int, default=320, help="KV blocks (16 tokens) per replica in the routing runs")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--split", action="store_true", help="the overhead runs compare serve-ray against serve-ray --engine-process (each replica's engine in a process of its own), not serve against serve-ray")
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--skip-routing", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    out_path, log_dir = start_run(args.out, "ray-")
    started = time.monotonic()
    result: dict[str, Any] = {"argv": sys.argv[1:] if argv is None else argv, "cpu": cpu_model(), "cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg()}
    if not args.skip_overhead:
        result["overhead"] = overhead(args, log_dir)
    if args.pairs:
        result["paired_ttft"] = paired_ttft(args, log_dir)
    if not args.skip_routing:
        result["routing"] = routing(args, log_dir)
    write_results(result, out_path, started, markdown)


if __name__ == "__main__":
    main()
