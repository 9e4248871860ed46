"""Quality cost of --quantization: mean token logprob of a fixed text, quantized vs bf16.

Scores every token of TEXT (about 400 tokens of varied English and code) under the native
path: mean log p(token | the text before it). Each variant runs one kernel for the whole text:
  int8, int4   the weight-only kernels, which a server runs for steps of few rows (decode):
               the cost a decoded token pays
  w8a8         the int8 GEMM with activations quantized per row, which both schemes run past
               that (prompt chunks, wide decode steps): the cost those rows pay

python -m ops.bench.quant_quality [--model DIR] [--variants bf16,int8,int4] [--out F]
"""

from __future__ import annotations

import argparse
import platform
import sys
from typing import Any

TEXT = """The committee met on Tuesday to review the quarterly budget. Revenue had grown by four
percent, mostly from the new subscription plans, while costs for cloud hosting rose faster than
expected. The treasurer proposed moving the archive to cheaper cold storage and renegotiating the
support contract before it renews in March.

def merge_sorted(a, b):
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i]); i += 1
        else:
            out.append(b[j]); j += 1
    return out + a[i:] + b[j:]

Photosynthesis converts light energy into chemical energy stored in glucose. In the light-dependent
reactions, water is split and oxygen is released; the Calvin cycle then fixes carbon dioxide using
ATP and NADPH. Plants in hot, dry climates often use C4 or CAM pathways to limit water loss.

Q: What is the capital of Australia?
A: Canberra, chosen in 1908 as a compromise between Sydney and Melbourne.

To reset the router, hold the button on the back for ten seconds until the light blinks orange,
then wait two minutes for it to restart. Your saved networks will be erased, so write down the
password printed on the label first."""


def score(model_dir: str, variant: str, threads: int) -> float:
    import torch

    from actors.runners.native.quant import QuantLinear
    from actors.runners.torch_runner import TorchRunner
    from ops.bench.prompt import load_tokenizer

    ids = load_tokenizer(model_dir)(TEXT)["input_ids"]
    blocks = -(-len(ids) // 16) + 1
    quantization = {"bf16": None, "w8a8": "int8"}.get(variant, variant)
    runner = TorchRunner(model_dir, dtype="bfloat16", num_kv_blocks=blocks, block_size=16, num_threads=threads, model_impl="native", quantization=quantization)
    runner.load()
    if quantization:  # one kernel at every row count: the int8 GEMM past 0 rows, else weight-only
        runner.model.model.linear = QuantLinear(max_rows=0 if variant == "w8a8" else sys.maxsize)
    with torch.inference_mode():
        step, positions = runner.model.build_step([(0, len(ids))], [list(range(blocks))], 16, runner.k_cache, runner.v_cache)
        logits = runner.model.forward(torch.tensor(ids), positions, step, torch.arange(len(ids) - 1), runner.k_cache, runner.v_cache)
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        return float(logprobs.gather(1, torch.tensor(ids[1:])[:, None]).mean())


def main(argv: list[str] | None = None) -> None:
    from ops.bench.bare_forward import emit_json
    from ops.bench.bare_native import _cpu_model
    from ops.bench.prompt import default_model_dir

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--variants", default="bf16,int8,int4,w8a8")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    model_dir = args.model or str(default_model_dir())
    means = {v: round(score(model_dir, v, args.threads), 4) for v in args.variants.split(",")}
    base = means.get("bf16")
    result: dict[str, Any] = {
        "model_dir": model_dir, "cpu": _cpu_model(), "platform": platform.platform(), "mean_token_logprob": means,
        "change_vs_bf16": {v: round(m - base, 4) for v, m in means.items()} if base is not None else None,
    }  # fmt: skip
    emit_json(result, args.out)


if __name__ == "__main__":
    main()
