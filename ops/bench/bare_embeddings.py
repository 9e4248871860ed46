"""How many inputs/s does the embedding model make with no server? all-MiniLM-L6-v2's own
forward in a plain loop, the baseline of ops.bench.embeddings.

    python -m ops.bench.bare_embeddings [--batches 1,16,64] [--inputs 512] [--threads 1,2] [--out F]

For each batch size B, the benchmark texts (ops.harness.prompts.build_texts, the same seeded
texts in the same order the server benchmark sends) are cut into batches of B; each batch is
tokenized (padding to its longest input, truncation at the model's max_seq_length), run
through `transformers.AutoModel` in float32 (the server's embedding dtype), mean-pooled over
the attention mask, L2-normalized and turned into Python lists, as a sentence-transformers
user would get them. inputs/s = inputs / total time of those batches (tokenization included;
`forward_inputs_s` leaves it out). One unmeasured batch per size first.

torch.inference_mode throughout; the whole sweep runs once per intra-op thread count in
`--threads` (default 1 and 2: on a 2-core machine shared with other work, 2 OpenMP threads
can run many times slower than 1, as their barriers wait on a descheduled thread), and `best`
holds the faster of them per batch size: the baseline is a ceiling. It also writes the vectors
of the first `--check` texts, which the server benchmark compares with the server's (cosine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ops.harness.load import parse_levels
from ops.harness.prompts import build_texts, embedding_model_dir
from ops.harness.stats import percentile

Embed = Callable[[list[str]], tuple[list[list[float]], float]]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_bare_embeddings(
    model_dir: str, texts: list[str], batches: list[int], inputs: int, time_cap: float, threads: Sequence[int] = (1, 2), check: int = 4
) -> dict[str, Any]:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    max_len = json.loads((Path(model_dir) / "sentence_bert_config.json").read_text()).get("max_seq_length", 256)

    def embed(batch: list[str]) -> tuple[list[list[float]], float]:
        enc = tok(batch, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
        f0 = time.perf_counter()
        hidden = model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
        forward = time.perf_counter() - f0
        return pooled.tolist(), forward

    out: dict[str, Any] = {
        "model_dir": model_dir,
        "torch": torch.__version__,
        "max_seq_length": max_len,
        "loadavg_start": os.getloadavg(),
        "threads": {},
    }
    with torch.inference_mode():
        out["check_vectors"] = embed(texts[:check])[0]
        for n_threads in threads:
            torch.set_num_threads(n_threads)
            out["threads"][str(n_threads)] = _sweep(embed, texts, batches, inputs, time_cap, n_threads)
    out["best"] = {}
    for b in batches:
        runs = [(res[str(b)]["inputs_s"], t) for t, res in out["threads"].items() if str(b) in res]
        if runs:
            _, t = max(runs)
            out["best"][str(b)] = {**out["threads"][t][str(b)], "threads": int(t)}
    out["loadavg_end"] = os.getloadavg()
    return out


def _sweep(embed: Embed, texts: list[str], batches: list[int], inputs: int, time_cap: float, n_threads: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for b in batches:
        embed([texts[(b + i) % len(texts)] for i in range(b)])  # warmup at this shape
        n_batches = max(1, -(-inputs // b))
        times: list[float] = []
        forwards: list[float] = []
        t_start = time.perf_counter()
        for k in range(n_batches):
            if times and time.perf_counter() - t_start > time_cap:
                break
            batch = [texts[(k * b + i) % len(texts)] for i in range(b)]
            t0 = time.perf_counter()
            _, forward = embed(batch)
            times.append(time.perf_counter() - t0)
            forwards.append(forward)
        done = len(times) * b
        entry: dict[str, Any] = {
            "batches_run": len(times),
            "inputs": done,
            "seconds": round(sum(times), 3),
            "inputs_s": round(done / sum(times), 2),
            "forward_inputs_s": round(done / sum(forwards), 2),
            "batch_ms": {"p50": round(1000 * statistics.median(times), 2), "p99": round(1000 * (percentile(times, 99) or 0.0), 2)},
            "hit_time_cap": len(times) < n_batches,
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        }
        res[str(b)] = entry
        _log(f"[bare embeddings] threads={n_threads} B={b}: {entry['inputs_s']} inputs/s (forward alone {entry['forward_inputs_s']}), batch p50 {entry['batch_ms']['p50']} ms")
    return res


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=parse_levels, default=[1, 16, 64])
    p.add_argument("--inputs", type=int, default=512, help="inputs per batch size (rounded up to whole batches)")
    p.add_argument("--time-cap", type=float, default=60.0, help="seconds per batch size after which no new batch starts")
    p.add_argument("--texts", type=int, default=512, help="distinct texts in the pool")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=parse_levels, default=[1, 2], help="intra-op thread counts to try (default 1,2)")
    p.add_argument("--check", type=int, default=4, help="texts whose vectors go into the output, for comparison")
    p.add_argument("--model", default=None, help="a sentence-transformers directory (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    model_dir = args.model or str(embedding_model_dir())
    texts = build_texts(args.texts, args.seed)
    result = run_bare_embeddings(model_dir, texts, args.batches, args.inputs, args.time_cap, args.threads, args.check)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    else:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
