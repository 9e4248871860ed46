"""Does reading a reasoning model's thinking apart from its answer cost throughput?

    python -m ops.bench.reasoning [--model DIR] [--concurrency 8] [--requests 32] [--rounds 3]
        [--max-tokens 64] [--template thinking|plain] [--out F]

Two `switchyard serve` processes on the same model, one with `--reasoning-parser auto` (the
thinking parsed out of every streamed chat chunk, reasoning tokens counted) and one with
`--reasoning-parser none` (the output passed through as content), in alternating rounds: each
round runs the same closed loop of streamed chat requests (`ignore_eos`, greedy, `max_tokens`
each) against both, in alternating order, and the figure is the median of the rounds' tok/s
ratios (on over off). Without `--model`, a tiny random Qwen3-shaped model is built with a
thinking template that opens `<think>` in the prompt (`--template thinking`: all the output
goes through the parser's thinking path, the one that searches for the end tag) or a plain one
(`--template plain`: no thinking format is found, so both servers run the same code: the
non-reasoning model's control). No real reasoning model ships with the project.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from ops.harness.results import cpu_model, log, start_run, write_results
from ops.harness.servers import switchyard_server

# DeepSeek-R1-0528's shape: history drops an assistant turn's thinking (so the template names
# `</think>`, which detection needs), and the generation prompt opens `<think>`.
THINKING = (
    "{%- for m in messages %}{%- if m['role'] == 'assistant' %}<|im_start|>assistant\n{{ m['content'].split('</think>')[-1] }}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{%- endif %}"
)
PLAIN = "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
CORPUS = ["Let me think about this step by step. First the question, then the answer.", "def f(x):\n    return x * 2\n"] * 8


def build_model(path: Path, template: str) -> Path:
    """A small random Qwen3 (4 layers, 256 wide) whose tokenizer has `<think>` and `</think>`."""
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    fast.chat_template = template
    fast.save_pretrained(path)
    config = Qwen3Config(
        vocab_size=len(fast), hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        max_position_embeddings=1024, tie_word_embeddings=True, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(path)
    return path


async def level(base_url: str, concurrency: int, requests: int, max_tokens: int, round_index: int) -> dict[str, Any]:
    """A closed loop of streamed chat requests; tok/s from usage over the wall time."""
    tokens: list[int] = []
    reasoning: list[int] = []

    async def one(client: httpx.AsyncClient, i: int) -> None:
        body = {
            "model": "bench", "messages": [{"role": "user", "content": f"Round {round_index} request {i}: think it through."}],
            "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            resp.raise_for_status()
            async for line in resp.aiter_lines():
                if line.startswith('data: {"') and '"usage":{' in line:
                    usage = json.loads(line[6:]).get("usage") or {}
                    tokens.append(usage.get("completion_tokens", 0))
                    reasoning.append((usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0))

    queue = list(range(requests))
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:

        async def worker() -> None:
            while queue:
                await one(client, queue.pop())

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return {"tok_s": round(sum(tokens) / wall, 2), "completion_tokens": sum(tokens), "reasoning_tokens": sum(reasoning), "wall_s": round(wall, 3)}


def render(result: dict[str, Any]) -> str:
    lines = ["| round | parser on tok/s | parser off tok/s | on/off |", "|---|---|---|---|"]
    for r in result["rounds"]:
        lines.append(f"| {r['round']} | {r['on']['tok_s']} | {r['off']['tok_s']} | {r['ratio']} |")
    lines.append(f"\nmedian on/off: {result['median_ratio']} ({result['template']} template, c={result['concurrency']}, {result['cpu']})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a model directory (default: a tiny random Qwen3 built now)")
    parser.add_argument("--template", choices=["thinking", "plain"], default="thinking")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--server-args", default="--dtype float32 --no-embeddings --num-threads 1")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    out_path, run_dir = start_run(args.out, "reasoning")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        model = args.model or str(build_model(Path(tmp) / "model", THINKING if args.template == "thinking" else PLAIN))
        base = ["--model", model, "--served-name", "bench", *args.server_args.split()]
        servers = {
            name: stack.enter_context(switchyard_server(run_dir / f"{name}.log", [*base, "--reasoning-parser", parser_name]))
            for name, parser_name in (("on", "auto"), ("off", "none"))
        }
        rounds = []
        for i in range(args.rounds):
            order = ("on", "off") if i % 2 == 0 else ("off", "on")
            got = {name: asyncio.run(level(servers[name].base_url, args.concurrency, args.requests, args.max_tokens, i)) for name in order}
            if args.template == "thinking" and not got["on"]["reasoning_tokens"]:
                raise SystemExit("the parser-on server counted no reasoning tokens: no thinking format was found, so nothing was measured")
            ratio = round(got["on"]["tok_s"] / got["off"]["tok_s"], 4)
            log(f"round {i}: on {got['on']['tok_s']} tok/s, off {got['off']['tok_s']} tok/s, on/off {ratio}")
            rounds.append({"round": i, **got, "ratio": ratio})
    result = {
        "question": "reasoning parser on vs off, tok/s", "template": args.template, "model": args.model or "tiny random Qwen3 (4x256)",
        "argv": ["python", "-m", "ops.bench.reasoning", *sys.argv[1:]],
        "concurrency": args.concurrency, "requests": args.requests, "max_tokens": args.max_tokens, "cpu": cpu_model(),
        "rounds": rounds, "median_ratio": statistics.median(r["ratio"] for r in rounds),
    }  # fmt: skip
    write_results(result, out_path, started, render)


if __name__ == "__main__":
    main()
