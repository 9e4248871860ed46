"""A random-weight GGUF of a real model's shape, for serving a GGUF by path beside llama-server.

    python -m ops.bench.gguf_random --llama-cpp DIR --out F.gguf [--shape llama-3.2-1b] [--type q4_0]

DIR is llama.cpp's source tree (the one vendored in the llama-cpp-python sdist, as
ops/bench/README.md builds llama-server from): its `convert_hf_to_gguf.py` writes the f16 file
and its vocabulary file `models/ggml-vocab-llama-bpe.gguf` gives the Llama 3 tokenizer; the
blocks are then requantized by ops/harness/gguf_files.py (Q4_0: llama.cpp's reference rounding,
every matrix as `llama-quantize --pure` makes it). Then, e.g.:

    python -m ops.bench.run --model F.gguf --llama-server PATH --levels 1,8 --skip-bare

Random weights write random tokens; `ignore_eos` keeps every request's length.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ops.harness.gguf_files import convert, requantize

SHAPES = {  # transformers LlamaConfig fields of the public configs
    "llama-3.2-1b": dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True, rms_norm_eps=1e-5,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    ),
}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--llama-cpp", required=True, type=Path, help="llama.cpp's source tree (convert_hf_to_gguf.py, models/)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    p.add_argument("--type", default="q4_0", help="q4_0, q4_1, q8_0 (gguf's quantizers) or f16")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    vocab = args.llama_cpp / "models" / "ggml-vocab-llama-bpe.gguf"
    tokenizer = AutoTokenizer.from_pretrained(vocab.parent, gguf_file=vocab.name)
    with tempfile.TemporaryDirectory(dir=args.out.parent) as tmp:
        hf = Path(tmp) / "hf"
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **SHAPES[args.shape])
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        model = model.to_empty(device="cpu").to(torch.bfloat16)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.02) if p.ndim == 2 else p.fill_(1.0)
        model.save_pretrained(hf)
        tokenizer.save_pretrained(hf)
        f16 = convert(args.llama_cpp / "convert_hf_to_gguf.py", hf, Path(tmp) / "f16.gguf", "f16")
        if args.type == "f16":
            f16.rename(args.out)
        else:
            requantize(f16, args.out, args.type)
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**30:.2f} GiB, {args.shape}, {args.type})")


if __name__ == "__main__":
    main()
