"""What does --quantization cost in quality? Mean token logprob of a fixed text, quantized vs bf16
(the dense upcast, `--quantization none --dtype bfloat16`).

Scores every token of TEXT (about 300 tokens of varied English and code) under the native
path: mean log p(token | the text before it), its change against bf16 with the standard error
of that change over the tokens, and the mean KL(bf16 || variant) of the next-token
distributions (less noisy than one token's logprob: it weighs every candidate). Each variant
runs one kernel for the whole text:
  int8, int4   the weight-only kernels, which a server runs for steps of few rows (decode):
               the cost a decoded token pays
  shipped      the checkpoint's own quantized blocks (the embedded model's Q4_1, its lm_head
               Q8_0) on the int4 weight-only kernel, no requantization (native/shipped.py):
               what the default serves a decoded token on CPU, against their bf16 upcast
  w8a8         the int8 GEMM with activations quantized per row, which every scheme runs past
  w8a8-int4    that (prompt chunks, wide decode steps): the cost those rows pay, with the
  w8a8-shipped int8 scheme's matrices, the int4 scheme's (smoothed differently) or shipped's
A `-nosmooth` suffix loads the variant without smoothing (actors/runners/native/smoothing.py).
A `served-` prefix (served-bf16, served-shipped, served-int4) runs the scheme as a server does
instead: the first SERVED_PROMPT tokens as one prompt (the int8 GEMM for quantized schemes),
then the rest decoded a token a step (weight-only), and is scored on the decoded tokens alone
(its row in the results says so): what a generated token costs after a quantized prompt.
served-bf16 is the noise floor of that split (bf16 rounds prompt and decode rows differently).

python -m ops.bench.quant_quality [--model DIR] [--variants bf16,shipped,int8,int4] [--out F]
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path
from typing import Any

from ops.harness.native_step import loading
from ops.harness.prompts import default_model_dir, load_tokenizer
from ops.harness.results import cpu_model, emit_json

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


SERVED = "served-"
SERVED_PROMPT = 128  # tokens of TEXT a served- variant prefills as its prompt


def score(model_dir: str, variant: str, threads: int) -> tuple[Any, Any]:
    """Log-probabilities `[T - 1, V]` of every next token of TEXT under `variant`, and the tokens."""
    import torch

    from actors.runners.native.quant import QuantLinear
    from actors.runners.runner_config import RunnerConfig
    from actors.runners.torch_runner import TorchRunner

    ids = load_tokenizer(model_dir)(TEXT)["input_ids"]
    blocks = -(-len(ids) // 16) + 1
    kernel, context = loading(variant.removeprefix(SERVED))
    quantization = {"bf16": "none", "w8a8": "int8", "w8a8-int4": "int4", "w8a8-shipped": "shipped"}.get(kernel, kernel)
    runner = TorchRunner(Path(model_dir), RunnerConfig(dtype="bfloat16", num_kv_blocks=blocks, block_size=16, num_threads=threads, model_impl="native", quantization=quantization))
    with context:
        runner.load()
    model: Any = runner.model  # loaded above
    if quantization != "none" and not variant.startswith(SERVED):  # one kernel at every row count: the int8 GEMM past 0 rows, else weight-only
        model.model.linear = QuantLinear(max_rows=0 if kernel.startswith("w8a8") else sys.maxsize)
    table, caches = [list(range(blocks))], (runner.k_cache, runner.v_cache)

    def step(start: int, tokens: list[int], keep: Any) -> Any:
        built, positions = model.build_step([(start, len(tokens))], table, 16, *caches)
        return model.forward(torch.tensor(tokens), positions, built, keep, *caches)

    with torch.inference_mode():
        if not variant.startswith(SERVED):
            logits = step(0, ids, torch.arange(len(ids) - 1))
        else:  # the prompt's rows, then one decode step per token (row t predicts ids[t + 1])
            rows = [step(0, ids[:SERVED_PROMPT], torch.arange(SERVED_PROMPT))]
            rows += [step(t, [ids[t]], torch.tensor([0])) for t in range(SERVED_PROMPT, len(ids) - 1)]
            logits = torch.cat(rows)
        return torch.log_softmax(logits.float(), dim=-1), torch.tensor(ids[1:])


def compare(logprobs: Any, base: Any, targets: Any) -> dict[str, float]:
    """Against bf16: change of the mean token logprob, its standard error, mean KL(bf16 || it)."""
    change = (logprobs - base).gather(1, targets[:, None])[:, 0]
    kl = (base.exp() * (base - logprobs)).sum(-1)
    return {"change": round(float(change.mean()), 4), "stderr": round(float(change.std() / len(change) ** 0.5), 4), "kl": round(float(kl.mean()), 4)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--variants", default="bf16,shipped,int8,int4,w8a8,w8a8-int4,w8a8-shipped")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    model_dir = args.model or str(default_model_dir())
    base, targets = score(model_dir, "bf16", args.threads)
    means: dict[str, float] = {}
    versus: dict[str, dict[str, float]] = {}
    for variant in args.variants.split(","):
        logprobs = base if variant == "bf16" else score(model_dir, variant, args.threads)[0]
        scored = slice(SERVED_PROMPT, None) if variant.startswith(SERVED) else slice(None)  # served-: the decoded tokens
        means[variant] = round(float(logprobs[scored].gather(1, targets[scored, None]).mean()), 4)
        versus[variant] = compare(logprobs[scored], base[scored], targets[scored])
        print(variant, means[variant], versus[variant], file=sys.stderr, flush=True)
    result: dict[str, Any] = {
        "model_dir": model_dir, "cpu": cpu_model(), "platform": platform.platform(), "tokens": len(targets), "argv": sys.argv[1:] if argv is None else argv,
        "served_variants_score": f"the {len(targets) - SERVED_PROMPT} tokens decoded after a {SERVED_PROMPT}-token prompt",
        "mean_token_logprob": means, "change_vs_bf16": {v: c["change"] for v, c in versus.items()},
        "stderr_of_change": {v: c["stderr"] for v, c in versus.items()}, "kl_vs_bf16": {v: c["kl"] for v, c in versus.items()},
    }  # fmt: skip
    emit_json(result, args.out)


if __name__ == "__main__":
    main()
