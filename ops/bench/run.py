"""The benchmark driver: bare-forward baseline, Switchyard under the load sweep, optional peers.

python -m ops.bench.run [--levels 1,4,16,32,64] [--peers] [--out ops/results/NAME.json]

1. bare forward (ops.bench.bare_forward, in a subprocess): decode tok/s per batch, bf16 and
   fp32, and the batch-1 TTFT baseline (prefill 128 + one decode step).
2. `switchyard serve` on a free loopback port (subprocess, its log beside the results), wait for
   GET /health = 200, run the sweep (ops.bench.load), stop it (SIGTERM, SIGKILL after a timeout).
3. with --peers: transformers serve --continuous-batching under the same sweep (ops.bench.peers).

Writes one JSON (config, machine load, every section, ratios) and prints a markdown table.
Every step is bounded: subprocess timeouts, health-check timeouts, per-level time caps and
per-request timeouts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ops.bench import native_sections
from ops.bench.load import DEFAULT_LEVELS, OUTPUT_TOKENS, parse_levels, prompts_needed, sweep, switchyard_target
from ops.bench.procs import json_from_subprocess
from ops.bench.prompt import PROMPT_TOKENS, build_prompts, default_model_dir, has_bos, load_tokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]
HEADLINE_C = 32
SECTIONS = native_sections.SECTIONS  # the server sections, Switchyard first
sections = native_sections.sections  # with the Switchyard variants of this run


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def start_run(out: str | None, prefix: str) -> tuple[Path, Path]:
    """How every benchmark starts: (results path, log directory), the results by default in
    ops/results/<prefix><UTC time>.json, the repository as working directory, and
    SIGTERM/SIGHUP unwinding like Ctrl-C, so the `finally` blocks stop the servers the run
    started (they run in their own process groups and would otherwise outlive it)."""

    def _exit_on_signal(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    os.chdir(REPO_ROOT)
    out_path = Path(out) if out else REPO_ROOT / "ops/results" / f"{prefix}{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    return out_path, out_path.parent / "logs" / out_path.stem


def write_results(result: dict[str, Any], out_path: Path, started: float, render: Callable[[dict[str, Any]], str]) -> None:
    """How every benchmark ends: load average and elapsed time, the markdown table (kept in the
    JSON too), an atomic write (an interrupted run never leaves half a file), the table printed."""
    result["loadavg_end"] = os.getloadavg()
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    result["markdown"] = table = render(result)
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out_path)
    print(table)
    log(f"results: {out_path}")


def run_bare(model_dir: str, batches: list[int], dtypes: list[str], steps: int, threads: int, out_dir: Path, timeout: float) -> dict[str, Any]:
    tmp = out_dir / f".bare-{os.getpid()}.json.tmp"
    cmd = [
        sys.executable, "-m", "ops.bench.bare_forward",
        "--batches", ",".join(map(str, batches)), "--dtypes", ",".join(dtypes),
        "--steps", str(steps), "--threads", str(threads), "--model", model_dir, "--out", str(tmp),
    ]  # fmt: skip
    return json_from_subprocess("bare forward", cmd, tmp, REPO_ROOT, timeout)


_DTYPE_RE = re.compile(r"dtype[\"']?\s*[=:]\s*[\"']?(?:torch\.)?(bfloat16|float32|float16)")


def server_dtype_from_log(text: str, served_name: str | None = None) -> str | None:
    """The dtype the server says it picked for the chat model (its runtime_ready log line).

    The server logs one runtime_ready line per model (an embedding model too); the line that
    names `served_name` wins, else the first one.
    """
    found: list[tuple[bool, str]] = []
    for line in text.splitlines():
        if "runtime_ready" in line:
            m = _DTYPE_RE.search(line)
            if m:
                found.append((served_name is not None and served_name in line, m.group(1)))
    for named, dtype in found:
        if named:
            return dtype
    return found[0][1] if found else None


def run_switchyard(
    model: str | None, served_name: str, prompts: list[str], levels: list[int], log_dir: Path, server_args: list[str], startup_timeout: float, **sweep_kwargs: Any
) -> dict[str, Any]:
    from ops.bench.switchyard_server import switchyard_server  # it imports this module

    out: dict[str, Any] = {"name": "switchyard", "log": str(log_dir / "switchyard.log")}
    started: list[Any] = []
    try:
        with switchyard_server(log_dir / "switchyard.log", [*(["--model", model] if model else []), *server_args], startup_timeout) as srv:
            started.append(srv)
            out.update(cmd=srv.cmd, startup_s=srv.startup_s, dtype=srv.dtype(served_name))
            t0 = time.monotonic()
            out["sweep"] = asyncio.run(sweep(switchyard_target(srv.base_url, served_name), prompts, levels, **sweep_kwargs))
            out["sweep_s"] = round(time.monotonic() - t0, 1)
    except Exception as e:  # noqa: BLE001 - reported in the results, the run goes on to the peers
        out["error"] = f"{type(e).__name__}: {e}"
        log(f"[switchyard] failed: {out['error'][:2000]}")
    if started:
        out["exit_code"] = started[0].info.get("exit_code")
    return out


def wait_for_quiet(max_load: float, max_wait: float, interval: float = 10.0) -> dict[str, Any]:
    """Wait (bounded) until the 1-minute load average is at most `max_load`; says how it went."""
    t0 = time.monotonic()
    for _ in range(int(max_wait / interval) + 1):
        load1 = os.getloadavg()[0]
        if load1 <= max_load:
            return {"quiet": True, "load1": load1, "waited_s": round(time.monotonic() - t0, 1)}
        if time.monotonic() - t0 >= max_wait:
            break
        log(f"[run] load average {load1:.2f} > {max_load}: waiting (up to {max_wait:.0f}s)")
        time.sleep(interval)
    return {"quiet": False, "load1": os.getloadavg()[0], "waited_s": round(time.monotonic() - t0, 1)}


def _level(section: dict[str, Any] | None, c: int) -> dict[str, Any] | None:
    if not section or "sweep" not in section:
        return None
    return next((lv for lv in section["sweep"]["levels"] if lv["concurrency"] == c), None)


def _bare_tok_s(bare: dict[str, Any], dtype: str, b: int, workload: bool = False) -> float | None:
    entry = bare.get("dtypes", {}).get(dtype, {}).get("batches", {}).get(str(b), {})
    return native_sections.workload_tok_s(entry, b, bare.get("decode_steps", 0)) if workload else entry.get("decode_tok_s")


def _div(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def compute_ratios(result: dict[str, Any]) -> dict[str, Any]:
    bare = result.get("bare_forward") or {}
    ratios: dict[str, Any] = {}
    bare_ttft = bare.get("dtypes", {}).get("bfloat16", {}).get("ttft_b1_ms")
    for section_name in sections(result):
        section = result.get(section_name)
        if not section or "sweep" not in section:
            continue
        r: dict[str, Any] = {}
        if result.get("bare_native", {}).get("variants"):
            baseline = result["bare_native_baseline"]
            r[f"tok_s_over_bare_native[{baseline}]_per_level"] = native_sections.ratios_over_bare_native(result, section, baseline)
            r[f"tok_s_over_bare_native_workload[{baseline}]_per_level"] = native_sections.ratios_over_bare_native(result, section, baseline, workload=True)
        lv32 = _level(section, HEADLINE_C)
        lv1 = _level(section, 1)
        # The headline numbers the brief asks for: tok/s at c=32 over bare bf16 batch 32, TTFT at c=1 over bare bf16 TTFT.
        r[f"tok_s_c{HEADLINE_C}_over_bare_bf16_b{HEADLINE_C}"] = _div(lv32 and lv32["output_tok_s"], _bare_tok_s(bare, "bfloat16", HEADLINE_C))
        # The same over the bare batch's prefill plus decode (native_sections.workload_tok_s says why).
        r[f"tok_s_c{HEADLINE_C}_over_bare_bf16_workload_b{HEADLINE_C}"] = _div(
            lv32 and lv32["output_tok_s"], _bare_tok_s(bare, "bfloat16", HEADLINE_C, workload=True)
        )
        r["ttft_c1_over_bare_bf16_ttft"] = _div(lv1 and lv1["ttft_ms"]["p50"], bare_ttft)
        # The first streamed token needs only the prefill: the tighter floor.
        r["ttft_c1_over_bare_bf16_prefill"] = _div(lv1 and lv1["ttft_ms"]["p50"], bare.get("dtypes", {}).get("bfloat16", {}).get("prefill_b1_ms"))
        # Per level, against the bare batch of the same size, in both dtypes and in the server's own.
        server_dtype = section.get("dtype")
        per_level = {}
        for lv in section["sweep"]["levels"]:
            c = lv["concurrency"]
            per_level[str(c)] = {
                "over_bare_bf16": _div(lv["output_tok_s"], _bare_tok_s(bare, "bfloat16", c)),
                "over_bare_fp32": _div(lv["output_tok_s"], _bare_tok_s(bare, "float32", c)),
                "over_bare_same_dtype": _div(lv["output_tok_s"], _bare_tok_s(bare, server_dtype, c)) if server_dtype else None,
            }
        r["tok_s_over_bare_per_level"] = per_level
        if server_dtype:
            same_ttft = bare.get("dtypes", {}).get(server_dtype, {}).get("ttft_b1_ms")
            r["ttft_c1_over_bare_same_dtype_ttft"] = _div(lv1 and lv1["ttft_ms"]["p50"], same_ttft)
        ratios[section_name] = r
    sy = result.get("switchyard")
    for peer in SECTIONS[1:]:
        other = result.get(peer)
        if sy and other and "sweep" in sy and "sweep" in other:
            ratios[f"switchyard_over_{peer}_tok_s"] = {
                str(lv["concurrency"]): _div(lv["output_tok_s"], (_level(other, lv["concurrency"]) or {}).get("output_tok_s")) for lv in sy["sweep"]["levels"]
            }
    return ratios


def _fmt(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"
    return str(x)


def markdown(result: dict[str, Any]) -> str:
    lines: list[str] = []
    bare = result.get("bare_forward") or {}
    if bare.get("dtypes"):
        dtypes = list(bare["dtypes"])
        batches = sorted({int(b) for d in dtypes for b in bare["dtypes"][d]["batches"]})
        lines += ["### Bare forward (no server): decode tok/s", "", "| batch | " + " | ".join(dtypes) + " |", "|---:|" + "---:|" * len(dtypes)]
        for b in batches:
            lines.append(f"| {b} | " + " | ".join(_fmt(_bare_tok_s(bare, d, b)) for d in dtypes) + " |")
        lines.append("")
        lines.append(
            "TTFT baseline (b=1, prefill 128 + 1 decode step): "
            + ", ".join(f"{d} {_fmt(bare['dtypes'][d].get('ttft_b1_ms'))} ms (prefill alone {_fmt(bare['dtypes'][d].get('prefill_b1_ms'))} ms)" for d in dtypes)
        )
        lines.append("")
    elif bare.get("error"):
        lines += [f"Bare forward: {bare['error']}", ""]
    lines += native_sections.markdown(result, _fmt)
    for key in sections(result):
        section = result.get(key)
        if not section:
            continue
        title = f"### {key} (dtype {section.get('dtype') or '?'})"
        if "sweep" not in section:
            lines += [title, "", f"not measured: {section.get('error') or section.get('skipped')}", ""]
            continue
        lines += [
            title,
            "",
            "| c | requests | ok | tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | chunk gap p50 ms | chunk gap p99 ms | errors |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for lv in section["sweep"]["levels"]:
            lines.append(
                f"| {lv['concurrency']} | {lv['requests']} | {lv['ok']} | {_fmt(lv['output_tok_s'])} | {_fmt(lv['ttft_ms']['p50'])} | {_fmt(lv['ttft_ms']['p99'])} "
                f"| {_fmt(lv['itl_req_ms']['p50'])} | {_fmt(lv['itl_req_ms']['p99'])} | {_fmt(lv['itl_chunk_ms']['p50'])} | {_fmt(lv['itl_chunk_ms']['p99'])} | {lv['errors']} |"
            )
        if section.get("error"):
            lines.append(f"\nerror: {section['error'][:500]}")
        lines.append("")
    ratios = result.get("ratios") or {}
    if ratios:
        lines += ["### Ratios", ""]
        for key in sections(result):
            r = ratios.get(key)
            if r:
                lines.append(
                    f"- {key}: tok/s c={HEADLINE_C} / bare bf16 b={HEADLINE_C} = {_fmt(r.get(f'tok_s_c{HEADLINE_C}_over_bare_bf16_b{HEADLINE_C}'))}; "
                    f"TTFT c=1 / bare bf16 TTFT = {_fmt(r.get('ttft_c1_over_bare_bf16_ttft'))} "
                    f"(/ bare bf16 prefill alone = {_fmt(r.get('ttft_c1_over_bare_bf16_prefill'))}); "
                    f"tok/s c={HEADLINE_C} / bare bf16 workload b={HEADLINE_C} = {_fmt(r.get(f'tok_s_c{HEADLINE_C}_over_bare_bf16_workload_b{HEADLINE_C}'))}"
                )
                for prefix, what in (("tok_s_over_bare_native[", "decode steps"), ("tok_s_over_bare_native_workload[", "workload")):
                    native = next((v for k, v in r.items() if k.startswith(prefix)), None)
                    if native:
                        lines.append(
                            f"  - over the bare native step ({result.get('bare_native_baseline')}, {what}): " + ", ".join(f"c={c}: {_fmt(v)}" for c, v in native.items())
                        )
        for peer in SECTIONS[1:]:
            if f"switchyard_over_{peer}_tok_s" in ratios:
                lines.append(f"- switchyard / {peer} tok/s per c: " + ", ".join(f"c={c}: {_fmt(v)}" for c, v in ratios[f"switchyard_over_{peer}_tok_s"].items()))
        lines.append("")
    lines.append(f"load average (1, 5, 15 min) at start {result.get('loadavg_start')}, at end {result.get('loadavg_end')} on {os.cpu_count()} CPUs")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", type=parse_levels, default=list(DEFAULT_LEVELS), help="concurrency levels (default 1,4,16,32,64)")
    p.add_argument("--peers", action="store_true", help="also sweep transformers serve --continuous-batching")
    p.add_argument("--llama-server", default=None, help="path of a llama-server binary: also sweep it (see README.md for the build)")
    p.add_argument("--out", default=None, help="results JSON (default ops/results/<UTC time>.json)")
    p.add_argument("--model", default=None, help="local HF model directory for every section (default: the embedded SmolLM2)")
    p.add_argument("--served-name", default=None, help="the request's model field for Switchyard (default: smollm2-135m-instruct, or the --model directory's name)")
    p.add_argument("--server-args", default="", help="extra `switchyard serve` arguments, one shell-quoted string, e.g. '--dtype bfloat16 --num-threads 2'")
    p.add_argument("--requests-per-slot", type=int, default=2, help="requests per level = max(this * c, --min-requests)")
    p.add_argument("--min-requests", type=int, default=8)
    p.add_argument("--time-cap", type=float, default=180.0, help="seconds per level after which no new request starts")
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--warmup", type=int, default=2, help="unmeasured requests before each server's sweep")
    p.add_argument("--prompt-mode", choices=["unique", "fixed"], default="unique", help="unique: a per-request header defeats prefix caching (default); fixed: one text for all")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--skip-bare", action="store_true")
    p.add_argument("--skip-switchyard", action="store_true")
    p.add_argument("--bare-from", default=None, help="reuse a bare-forward result instead of measuring: a bare_forward.py JSON or a run.py results JSON")
    p.add_argument("--bare-batches", type=parse_levels, default=None, help="default: the --levels")
    p.add_argument("--bare-dtypes", default="bfloat16,float32")
    p.add_argument("--bare-steps", type=int, default=OUTPUT_TOKENS)
    p.add_argument("--bare-threads", type=int, default=2)
    p.add_argument("--bare-timeout", type=float, default=1200.0)
    p.add_argument("--bare-native", default=None, help="also the bare native step baseline (ops.bench.bare_native) for these variants, e.g. native,native+int4,transformers")
    p.add_argument("--bare-native-baseline", default="native", help="the bare native variant the servers' tok/s are divided by")
    p.add_argument("--switchyard-variants", default="", help="more Switchyard sections, 'name=server args;...', e.g. 'hf=--model-impl transformers;int4=--quantization int4'")
    p.add_argument("--peer-dtype", default="match", help="transformers serve --dtype; 'match' = the dtype Switchyard reported (else auto)")
    p.add_argument("--cb-num-blocks", type=int, default=80, help="transformers serve --cb-num-blocks (pages of 256 tokens; 0: its own default)")
    p.add_argument("--cb-max-batch-tokens", type=int, default=512, help="transformers serve --cb-max-batch-tokens (0: its own default)")
    p.add_argument("--quiet-load", type=float, default=None, help="before each section, wait until the 1-min load average is at most this")
    p.add_argument("--quiet-wait", type=float, default=300.0, help="the longest such wait, seconds (then it goes on and records it)")
    args = p.parse_args(argv)

    out_path, log_dir = start_run(args.out, "")

    if args.model:
        model_dir = str(Path(args.model).resolve())
        served_name = args.served_name or Path(model_dir).name
    else:
        model_dir = str(default_model_dir())
        served_name = args.served_name or "smollm2-135m-instruct"
    tok = load_tokenizer(model_dir)
    n_prompts = prompts_needed(args.levels, args.requests_per_slot, args.min_requests, args.warmup)
    prompts = build_prompts(model_dir, n_prompts, PROMPT_TOKENS, args.prompt_mode)
    sweep_kwargs = dict(
        max_tokens=OUTPUT_TOKENS, time_cap=args.time_cap, request_timeout=args.request_timeout, requests_per_slot=args.requests_per_slot,
        min_requests=args.min_requests, warmup_requests=args.warmup, expected_prompt_tokens=PROMPT_TOKENS,
    )  # fmt: skip

    result: dict[str, Any] = {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": sys.argv[1:] if argv is None else argv,
        "model_dir": model_dir,
        "served_name": served_name,
        "prompt": {"tokens": PROMPT_TOKENS, "mode": args.prompt_mode, "distinct": len(set(prompts)), "tokenizer_adds_bos": has_bos(tok), "example": prompts[0]},
        "output_tokens": OUTPUT_TOKENS,
        "levels": args.levels,
        "cpu_count": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
    }
    t_start = time.monotonic()
    waits: dict[str, Any] = {}
    result["quiet_waits"] = waits

    def settle(section: str) -> None:
        if args.quiet_load is not None:
            waits[section] = wait_for_quiet(args.quiet_load, args.quiet_wait)

    if args.bare_from:
        loaded = json.loads(Path(args.bare_from).read_text())
        result["bare_forward"] = loaded.get("bare_forward", loaded)
        result["bare_forward_from"] = args.bare_from
    elif not args.skip_bare:
        settle("bare_forward")
        result["bare_forward"] = run_bare(
            model_dir, args.bare_batches or args.levels, [d for d in args.bare_dtypes.split(",") if d], args.bare_steps, args.bare_threads, out_path.parent, args.bare_timeout
        )
    if args.bare_native:
        settle("bare_native")
        native_sections.bare_native_section(result, args, model_dir, out_path.parent)
    if not args.skip_switchyard:
        settle("switchyard")
        result["switchyard"] = run_switchyard(
            args.model, served_name, prompts, args.levels, log_dir, shlex.split(args.server_args), args.startup_timeout, **sweep_kwargs
        )
    for name, extra in native_sections.parse_variants(args.switchyard_variants).items():
        settle(native_sections.VARIANT_PREFIX + name)
        variant_args = [*shlex.split(args.server_args), *extra]
        result[native_sections.VARIANT_PREFIX + name] = run_switchyard(args.model, served_name, prompts, args.levels, log_dir / name, variant_args, args.startup_timeout, **sweep_kwargs)
    if args.peers:
        from ops.bench.peers import run_transformers_serve

        settle("transformers_serve")
        peer_dtype = args.peer_dtype
        if peer_dtype == "match":
            peer_dtype = (result.get("switchyard") or {}).get("dtype") or "auto"
        result["transformers_serve"] = run_transformers_serve(
            model_dir, prompts, args.levels, log_dir, dtype=peer_dtype, cb_num_blocks=args.cb_num_blocks or None,
            cb_max_batch_tokens=args.cb_max_batch_tokens or None, startup_timeout=args.startup_timeout, **sweep_kwargs,
        )  # fmt: skip
    if args.llama_server:
        from ops.bench.peers import run_llama_server

        settle("llama_server")
        result["llama_server"] = run_llama_server(args.llama_server, prompts, args.levels, log_dir, startup_timeout=args.startup_timeout, **sweep_kwargs)
    result["ratios"] = compute_ratios(result)
    write_results(result, out_path, t_start, markdown)


if __name__ == "__main__":
    main()
