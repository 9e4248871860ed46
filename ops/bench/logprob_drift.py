"""How far do a server's prompt logprobs drift from the model it serves?

Scores 20 short prompts (about 430 tokens) through `/v1/completions` with `echo` and
`logprobs` (what lm-eval's `local-completions` asks), and the same tokens under transformers
in float32 on the served weights' dense upcast (the model store's `model.safetensors`: for the
embedded model, the Q4_1 blocks dequantized exactly). Per server: the mean and max |Δ logprob|
over the prompt tokens, in nats, and how often the server's top token is the reference's.
Within bf16's noise is the target (a dense bf16 model's own drift measures that noise).

python -m ops.bench.logprob_drift [--variants 'default=;dense=--quantization none'] [--out F]

A variant is `name[@checkout]=server args`: `@DIR` serves from another checkout (an earlier
commit's worktree, to measure before and after in one run).
"""

from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path
from typing import Any

from ops.harness.prompts import default_model_dir, load_tokenizer
from ops.harness.results import cpu_model, log, start_run, utc_now, write_results
from ops.harness.servers import DEFAULT_SERVED_NAME, switchyard_server

PROMPTS = [
    "The committee met on Tuesday to review the quarterly budget.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "def merge_sorted(a, b):\n    out, i, j = [], 0, 0",
    "Q: What is the capital of Australia?\nA: Canberra.",
    "To reset the router, hold the button on the back for ten seconds.",
    "The train to the city leaves every morning at seven, except on Sundays.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "She opened the window and the smell of rain filled the small kitchen.",
    "SELECT name, email FROM users WHERE created_at > '2024-01-01';",
    "The mitochondria is the powerhouse of the cell, producing most of its ATP.",
    "In 1969, Apollo 11 landed the first humans on the Moon.",
    "Please remember to bring your passport and a printed copy of the ticket.",
    "import numpy as np\nx = np.linspace(0, 1, 100)",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "Machine learning models learn patterns from examples rather than rules.",
    "The lighthouse keeper wrote about the weather in his small notebook.",
    "A prime number has exactly two divisors: one and itself.",
    "The museum is open from ten to six, and entry is free on the first Sunday.",
    "for (int i = 0; i < n; i++) { sum += values[i]; }",
    "Dear team, the release is postponed until the tests pass on every platform.",
]


def reference(model_dir: str, prompts: list[list[int]], tok: Any) -> list[list[tuple[float, str]]]:
    """Per prompt, per token after the first: (logprob of the token, the top token's text), float32."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = []
    with torch.inference_mode():
        for ids in prompts:
            logprobs = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
            out.append([(float(logprobs[i, ids[i + 1]]), tok.decode([int(logprobs[i].argmax())])) for i in range(len(ids) - 1)])
    return out


def served(base_url: str, served_name: str, prompts: list[list[int]]) -> list[list[tuple[float, str]]]:
    """The same pairs from a server's echoed prompt logprobs (its top entry's text)."""
    import httpx

    out = []
    for ids in prompts:
        body = {"model": served_name, "prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}
        choice = httpx.post(base_url + "/v1/completions", json=body, timeout=120).raise_for_status().json()["choices"][0]["logprobs"]
        values, tops = choice["token_logprobs"][1 : len(ids)], choice["top_logprobs"][1 : len(ids)]
        out.append([(float(v), max(top, key=top.get) if top else "") for v, top in zip(values, tops)])
    return out


def compare(ref: list[list[tuple[float, str]]], got: list[list[tuple[float, str]]]) -> dict[str, Any]:
    deltas, same_top = [], 0
    for r_rows, g_rows in zip(ref, got):
        for (r, r_top), (g, g_top) in zip(r_rows, g_rows):
            deltas.append(abs(r - g))
            same_top += r_top == g_top
    return {"tokens": len(deltas), "mean_abs_delta": round(sum(deltas) / len(deltas), 4), "max_abs_delta": round(max(deltas), 4), "top_token_agrees": round(same_top / len(deltas), 4)}


def parse_variants(spec: str) -> dict[str, tuple[Path | None, list[str]]]:
    out: dict[str, tuple[Path | None, list[str]]] = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, args = part.partition("=")
        name, at, checkout = name.strip().partition("@")
        out[name] = (Path(checkout) if at else None, shlex.split(args))
    return out


def render(result: dict[str, Any]) -> str:
    lines = ["| server | server args | prompt tokens | mean abs Δ logprob (nats) | max | top token agrees |", "|---|---|---:|---:|---:|---:|"]
    for name, row in result["variants"].items():
        if "error" in row:
            lines.append(f"| {name} | `{' '.join(row['args'])}` | error: {row['error'][:80]} | | | |")
        else:
            lines.append(f"| {name} | `{' '.join(row['args'])}` {row.get('impl', '')} | {row['tokens']} | {row['mean_abs_delta']} | {row['max_abs_delta']} | {row['top_token_agrees']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="default=;dense=--quantization none", help="'name[@checkout]=server args;...' (default: the default and its dense bf16 upcast)")
    p.add_argument("--out", default=None)
    p.add_argument("--startup-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    out_path, log_dir = start_run(args.out, "logprob-drift-")
    started = time.monotonic()
    model_dir = str(default_model_dir())
    tok = load_tokenizer(model_dir)
    prompts = [tok(text)["input_ids"] for text in PROMPTS]
    ref = reference(model_dir, prompts, tok)
    result: dict[str, Any] = {"started_utc": utc_now(), "cpu": cpu_model(), "model_dir": model_dir, "reference": "transformers float32 on the dense upcast", "variants": {}}
    for name, (checkout, server_args) in parse_variants(args.variants).items():
        row: dict[str, Any] = {"args": server_args, **({"checkout": str(checkout)} if checkout else {})}
        try:
            with switchyard_server(log_dir / f"{name}.log", ["--no-embeddings", *server_args], args.startup_timeout, checkout=checkout) as srv:
                models = srv_models(srv.base_url)
                row["impl"] = models.get(DEFAULT_SERVED_NAME, "")
                row.update(compare(ref, served(srv.base_url, DEFAULT_SERVED_NAME, prompts)))
        except Exception as exc:  # noqa: BLE001 - one variant's failure is reported, the others run
            row["error"] = f"{type(exc).__name__}: {exc}"
            log(f"[{name}] failed: {row['error']}")
        result["variants"][name] = row
    write_results(result, out_path, started, render)


def srv_models(base_url: str) -> dict[str, str]:
    import httpx

    return {m["id"]: m.get("model_impl", "") for m in httpx.get(base_url + "/v1/models", timeout=30).json()["data"]}


if __name__ == "__main__":
    main()
