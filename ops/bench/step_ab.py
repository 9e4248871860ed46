"""Which of two model-path variants is faster, on a machine others share? An interleaved A/B.

python -m ops.bench.step_ab --variants native,native+int4,transformers [--batches 1,4,32] [--steps 24] [--prefill] [--device cuda]

Loads every variant (ops.harness.native_step's `impl[+compile][+int8|+int4]`, `-nosmooth` to
load it without actors/runners/native/smoothing.py) in one process,
prefills the 128-token benchmark prompt at batch B in each, then runs decode steps round-robin:
variant 1, variant 2, ..., variant 1, ... so load from other processes hits all alike. With
--threads 1 (the default) each step is timed in process CPU time, which other processes'
work does not inflate; with more threads in wall time. Prints each variant's median step and
its speed relative to the first variant. With --prefill the timed step is the prefill itself
(B fresh 128-token prompts in one packed step, repeated), not the decode steps after it. With
--chunk N each timed decode step also carries a fresh N-token prompt chunk (one more sequence,
prefilled anew in its own blocks every step): a step of decodes beside a prompt's chunk; with
--split 1,2 the same N tokens also go as two chunks of two sequences, each split timed as a
variant of its own (`VARIANT/2`), interleaved with the others: one chunk against several.
On CUDA (the default where torch sees one; --device picks) steps are timed in wall time, each
ending with a synchronize: `native` replays CUDA graphs there, `native+nographs` runs eager.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from ops.harness import native_step as ns
from ops.harness.load import parse_levels
from ops.harness.prompts import build_prompt_ids, default_model_dir
from ops.harness.results import cpu_model


def run(
    model_dir: str, variants: list[str], batches: list[int], steps: int, threads: int, prefill: bool = False, device: str | None = None, chunk: int = 0,
    splits: tuple[int, ...] = (1,),
) -> dict[str, Any]:  # fmt: skip
    import torch

    torch.set_num_threads(threads)
    ids = build_prompt_ids(model_dir, 128)
    loaded = {v: ns.build_runner(model_dir, v, "bfloat16", max(batches) + (max(splits) if chunk else 0), len(ids), steps + 8, threads, device) for v in variants}
    # A variant per (variant, split): the same runner, its chunk in `split` sequences.
    runners = {(v if split == 1 else f"{v}/{split}"): loaded[v] for v in variants for split in (splits if chunk else (1,))}
    split_of = {name: int(name.rpartition("/")[2]) if "/" in name else 1 for name in runners}
    variants = list(runners)
    on_cuda = runners[variants[0]][0].device.type == "cuda"
    clock = time.process_time if threads == 1 and not on_cuda else time.perf_counter
    out: dict[str, Any] = {
        "cpu": cpu_model(), "gpu": ns.torch_gpu() if on_cuda else None, "device": str(runners[variants[0]][0].device), "model_dir": model_dir,
        "impls": {v: r.model.impl for v, (r, _) in runners.items()}, "threads": threads, "clock": clock.__name__, "steps": steps,
        "timed": "prefill" if prefill else f"decode beside a {chunk}-token chunk" if chunk else "decode", "batches": {},
    }  # fmt: skip
    with torch.inference_mode():
        for b in batches:
            per_seq = runners[variants[0]][1]
            tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(b + max(splits))]
            chunk_ids = torch.tensor(ids[:chunk])
            prompts, prompt_ids = [(0, len(ids))] * b, torch.tensor(ids * b)  # built once, outside the timed steps
            toks = {v: ns.step(r, prompts, tables[:b], prompt_ids) for v, (r, _) in runners.items()}
            times: dict[str, list[float]] = {v: [] for v in variants}
            for i in range(steps):
                for v, (r, _) in runners.items():
                    started = clock()
                    if prefill:
                        ns.step(r, prompts, tables[:b], prompt_ids)
                    elif chunk:
                        parts = [len(part) for part in chunk_ids.tensor_split(split_of[v])]
                        toks[v] = ns.step(r, [(len(ids) + i, 1)] * b + [(0, n) for n in parts], tables[: b + len(parts)], torch.cat([toks[v], chunk_ids]))[:b]
                    else:
                        toks[v] = ns.step(r, [(len(ids) + i, 1)] * b, tables[:b], toks[v])
                    times[v].append(clock() - started)
            median = {v: statistics.median(t[2:]) * 1000 for v, t in times.items()}
            out["batches"][str(b)] = {v: {"step_ms": round(m, 2), "speed_vs_first": round(median[variants[0]] / m, 3)} for v, m in median.items()}
            print(f"{out['timed']} B={b} " + "  ".join(f"{v}: {m:.1f} ms ({median[variants[0]] / m:.2f}x)" for v, m in median.items()), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="native,transformers")
    p.add_argument("--batches", type=parse_levels, default=[1, 4, 32])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prefill", action="store_true", help="time the prefill step (B prompts of 128 tokens), not decode")
    p.add_argument("--chunk", type=int, default=0, help="each timed decode step also carries a fresh prompt chunk of this many tokens")
    p.add_argument("--split", type=parse_levels, default=[1], help="with --chunk: the chunk's tokens in this many sequences' chunks, each count a variant (e.g. 1,2)")
    p.add_argument("--model", default=None)
    p.add_argument("--device", default=None, help="cuda, cpu, cuda:1, ... (default: cuda when torch sees one, else cpu)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    result = run(args.model or str(default_model_dir()), args.variants.split(","), args.batches, args.steps, args.threads, args.prefill, args.device, args.chunk, tuple(args.split))
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
