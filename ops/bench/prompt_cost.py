"""What does a prompt token cost through the server, against the runner's bare prefill?

    python -m ops.bench.prompt_cost [--prompt-tokens 1024] [--levels 1,4] [--threads 2] [--repeats 5] [--out F]

Issue 41 asks prompt tokens through the server to cost little more than the bare prefill's
(on a GPU, where each prompt token gathered its whole context, they cost several times it). On
the default model and flags:

1. Bare: a `TorchRunner` with the server's settings (`RunnerConfig.of` a default
   `RuntimeConfig`, this many torch threads), one prompt of `--prompt-tokens` random ids fed in
   chunks of the step budget (512 tokens, as the scheduler feeds a lone prompt), the last chunk
   sampling one token, in fresh blocks each repeat; per prompt token: the median repeat's
   `execute` time (the plan applied, inputs, forward, sampling) and its forward alone.
2. Server: `switchyard serve` (the same threads), `--prompt-tokens`-token unique prompts
   (verified by the usage), one token out, non-streamed, at each of `--levels`; per prompt token:
   at c = 1 the median request's latency / prompt tokens (HTTP, tokenizing, scheduling and
   the prefill of one prompt), at c > 1 the level's wall / its prompt tokens (the engine busy
   with prompts throughout).

Prints each, the server's over the bare `execute`, and writes one JSON. Alone on a quiet
machine: never beside another benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from ops.harness.load import parse_levels, prompts_needed, sweep, switchyard_target
from ops.harness.prompts import build_prompts, default_model_dir
from ops.harness.results import cpu_model, log, start_run, write_results
from ops.harness.servers import DEFAULT_SERVED_NAME, switchyard_server

CHUNK = 512  # RuntimeConfig's max_num_batched_tokens: a lone prompt's chunk


def bare(model_dir: Path, prompt_tokens: int, threads: int, repeats: int) -> dict[str, Any]:
    import torch

    from actors.runners.runner_config import RunnerConfig
    from actors.runners.torch_runner import TorchRunner
    from runtime.config import RuntimeConfig
    from runtime.messages import NewRequest, ScheduledSeq, StepPlan
    from runtime.sampling import SamplingParams

    block = RuntimeConfig().block_size
    per_prompt = -(-(prompt_tokens + 1) // block)
    runner = TorchRunner(model_dir, RunnerConfig.of(RuntimeConfig(num_threads=threads, num_kv_blocks=per_prompt * (repeats + 1) + 8), None, None))
    info = runner.load()
    runner.warmup()
    model: Any = runner.model
    inner, forward_s = model.forward, []

    def timed(*args: Any) -> Any:
        start = time.perf_counter()
        out = inner(*args)
        forward_s.append(time.perf_counter() - start)
        return out

    model.forward = timed
    gen = torch.Generator().manual_seed(0)
    greedy = SamplingParams(temperature=0.0, max_tokens=1)
    execute_ms, forward_ms = [], []
    for r in range(repeats + 1):  # the first unmeasured
        ids = torch.randint(3, info.vocab_size, (prompt_tokens,), generator=gen).tolist()
        table, rid = list(range(r * per_prompt, (r + 1) * per_prompt)), f"prompt-{r}"
        forward_s.clear()
        started = time.perf_counter()
        for start in range(0, prompt_tokens, CHUNK):
            chunk = ids[start : start + CHUNK]
            last = start + len(chunk) == prompt_tokens
            seq = ScheduledSeq(request_id=rid, token_ids=chunk, start_pos=start, block_table=table, sample=last, sampling=greedy, seed=0)
            runner.execute(StepPlan(step_id=start, seqs=(seq,), new_requests=(NewRequest(request_id=rid, prompt_token_ids=tuple(ids)),) if start == 0 else ()))
        elapsed = time.perf_counter() - started
        runner.execute(StepPlan(step_id=-1, seqs=(), freed_request_ids=(rid,)))
        if r:
            execute_ms.append(elapsed * 1e3)
            forward_ms.append(sum(forward_s) * 1e3)
    runner.close()
    return {
        "impl": info.impl, "dtype": info.dtype, "repeats": repeats,
        "execute_ms_a_token": round(statistics.median(execute_ms) / prompt_tokens, 4),
        "forward_ms_a_token": round(statistics.median(forward_ms) / prompt_tokens, 4),
    }  # fmt: skip


def server(model_dir: Path, prompt_tokens: int, threads: int, levels: list[int], requests_per_slot: int, log_dir: Path) -> dict[str, Any]:
    count = prompts_needed(levels, requests_per_slot, 4, 2)
    prompts = build_prompts(str(model_dir), count, prompt_tokens, "unique")
    args = ["--no-embeddings", "--num-threads", str(threads), "--log-level", "warning"]
    with switchyard_server(log_dir / "server.log", args) as srv:
        result = asyncio.run(
            sweep(switchyard_target(srv.base_url, DEFAULT_SERVED_NAME), prompts, levels, max_tokens=1, requests_per_slot=requests_per_slot, min_requests=4,
                  warmup_requests=2, expected_prompt_tokens=prompt_tokens)
        )  # fmt: skip
    out: dict[str, Any] = {"cmd": srv.cmd, "levels": {}}
    for level in result["levels"]:
        c, done = level["concurrency"], level["ok"]
        per_token = level["latency_ms"]["p50"] / prompt_tokens if c == 1 else level["wall_s"] * 1e3 / (done * prompt_tokens)
        out["levels"][str(c)] = {"ms_a_token": round(per_token, 4), "requests": done, "errors": level["errors"], "wall_s": level["wall_s"]}
    return out


def markdown(result: dict[str, Any]) -> str:
    b = result["bare"]
    lines = [
        f"CPU: {result['cpu']}; {result['prompt_tokens']}-token prompts, {result['threads']} threads, {b['impl']} ({b['dtype']})", "",
        "| what | ms a prompt token | over bare execute |", "|---|---:|---:|",
        f"| bare forward | {b['forward_ms_a_token']} | {b['forward_ms_a_token'] / b['execute_ms_a_token']:.2f} |",
        f"| bare execute | {b['execute_ms_a_token']} | 1.00 |",
    ]  # fmt: skip
    for c, level in result["server"]["levels"].items():
        lines.append(f"| server c={c} | {level['ms_a_token']} | {level['ms_a_token'] / b['execute_ms_a_token']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--levels", type=parse_levels, default=[1, 4])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests-per-slot", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    out_path, log_dir = start_run(args.out, "prompt-cost-")
    started = time.monotonic()
    model_dir = default_model_dir()
    result: dict[str, Any] = {"cpu": cpu_model(), "prompt_tokens": args.prompt_tokens, "threads": args.threads}
    log("[prompt-cost] bare prefill")
    result["bare"] = bare(model_dir, args.prompt_tokens, args.threads, args.repeats)
    log(f"[prompt-cost] bare: {result['bare']}")
    result["server"] = server(model_dir, args.prompt_tokens, args.threads, args.levels, args.requests_per_slot, log_dir)
    write_results(result, out_path, started, markdown)


if __name__ == "__main__":
    main()
