"""How much host work does the runner do around its forward, a row? `TorchRunner.execute` timed
apart from its model's forward, on a trivial model.

    python -m ops.bench.runner_host [--rows 64] [--steps 200] [--prompt 32] [--vocab 49152] [--dtype float32] [--out F]

The runner's share of a step on a GPU, where the forward's own host time is a graph replay, is
everything `execute` does besides `model.forward`: the plan applied to the request states,
the step's inputs (token ids, positions, slots, block tables), the logit rows, sampling, the
`tolist()` and the result. Here the model is a random 1-layer Llama of width 64 with a real
vocabulary size (the sampler's work scales with it), on the CPU, one torch thread, so the
forward is short and timed apart (`model.forward` wrapped); `--rows` requests decode together
for `--steps` steps after a prompt step of `--prompt` tokens a row, each mode in turn (greedy;
temperature 1; top-k 50 + top-p 0.9 + a seed; greedy with 5 logprobs; Qwen2.5's
generation_config: temperature 0.7, top-k 20, top-p 0.8, repetition penalty 1.05), and the host
figure is the median over steps of (execute - forward) / rows, in microseconds (issue 41's target: <= 8 us a row at 64 rows).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ops.harness.results import cpu_model, emit_json

MODES = {
    "greedy": {"temperature": 0.0},
    "temperature 1": {"temperature": 1.0},
    "top-k top-p seed": {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "seed": 7},
    "greedy + 5 logprobs": {"temperature": 0.0, "logprobs": 5},
    "qwen2.5 defaults": {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05},  # its generation_config.json
}


def trivial_model(vocab: int, where: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    LlamaForCausalLM(config).save_pretrained(where)
    return where


def run_mode(runner: Any, rows: int, steps: int, sampling: dict[str, Any], prompt: int = 32) -> dict[str, float]:
    from runtime.messages import NewRequest, ScheduledSeq, StepPlan
    from runtime.sampling import SamplingParams

    params = SamplingParams(max_tokens=steps + 1, **sampling)
    per_row = -(-(prompt + steps + 2) // runner.block_size)
    tables = [list(range(r * per_row, (r + 1) * per_row)) for r in range(rows)]
    ids = [f"r{r}-{time.monotonic_ns()}" for r in range(rows)]
    tokens = [[(7 * r + i) % 1000 + 3 for i in range(prompt)] for r in range(rows)]
    seqs = tuple(ScheduledSeq(request_id=ids[r], token_ids=tokens[r], start_pos=0, block_table=tables[r], sample=True, sampling=params, seed=r) for r in range(rows))
    new = tuple(NewRequest(request_id=ids[r], prompt_token_ids=tuple(tokens[r])) for r in range(rows))
    result = runner.execute(StepPlan(step_id=0, seqs=seqs, new_requests=new))
    forward_s: list[float] = []
    inner = runner.model.forward

    def timed(*args: Any) -> Any:
        start = time.perf_counter()
        out = inner(*args)
        forward_s.append(time.perf_counter() - start)
        return out

    runner.model.forward = timed
    host: list[float] = []
    try:
        for step in range(steps):
            seqs = tuple(
                ScheduledSeq(request_id=ids[r], token_ids=[result.sampled[ids[r]]], start_pos=prompt + step, block_table=tables[r], sample=True, sampling=params, seed=r)
                for r in range(rows)
            )
            start = time.perf_counter()
            result = runner.execute(StepPlan(step_id=step + 1, seqs=seqs))
            host.append((time.perf_counter() - start - forward_s[-1]) / rows * 1e6)
    finally:
        runner.model.forward = inner
    runner.execute(StepPlan(step_id=steps + 1, seqs=(), freed_request_ids=tuple(ids)))
    return {"host_us_a_row_p50": round(statistics.median(host), 2), "forward_ms_p50": round(statistics.median(forward_s) * 1e3, 3)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--prompt", type=int, default=32, help="each row's prompt tokens (penalties read the whole history)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    import torch

    from actors.runners.runner_config import RunnerConfig
    from actors.runners.torch_runner import TorchRunner

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = trivial_model(args.vocab, Path(tmp))
        runner = TorchRunner(model, RunnerConfig(device="cpu", dtype=args.dtype, num_kv_blocks=args.rows * (-(-(args.steps + args.prompt + 8) // 16)) + 8, num_threads=1, max_num_seqs=args.rows))
        info = runner.load()
        runner.warmup()
        result: dict[str, Any] = {"cpu": cpu_model(), "rows": args.rows, "steps": args.steps, "prompt": args.prompt, "vocab": args.vocab, "impl": info.impl, "modes": {}}
        for mode in args.modes.split(","):
            run_mode(runner, args.rows, 10, MODES[mode], args.prompt)  # its first use of each shape unmeasured
            result["modes"][mode] = entry = run_mode(runner, args.rows, args.steps, MODES[mode], args.prompt)
            print(f"[runner-host] {mode}: {entry['host_us_a_row_p50']} us a row (forward {entry['forward_ms_p50']} ms)", file=sys.stderr, flush=True)
        runner.close()
    emit_json(result, args.out)


if __name__ == "__main__":
    main()
