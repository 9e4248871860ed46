"""A tiny random-weight Llama and a byte-level BPE tokenizer, built in-process (no hub).

Used by the actor, API and greedy-equivalence tests: everything real (transformers model,
fast tokenizer, chat template) except the size.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Switchyard serves language models with continuous batching.",
    "Paged attention keeps keys and values in fixed-size blocks.",
    "Héllo wörld, ünïcode çharacters — and emoji 😀 too.",
    "def add(a, b):\n    return a + b\n",
] * 4


def build_tokenizer(path: Path, added: tuple[str, ...] = (), template: str = CHAT_TEMPLATE):  # type: ignore[no-untyped-def]
    """`added`: tokens added as whole ones but not special (shown in decoded text, as Qwen3's
    `<think>` and `</think>` are); `template`: the chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    if added:
        fast.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    fast.chat_template = template
    fast.save_pretrained(path)
    return fast


def build_tiny_llama(path: Path, *, seed: int = 0, layers: int = 2) -> Path:
    """Write a tiny random Llama + tokenizer to `path` and return it."""
    return build_tiny_decoder(path, "llama", seed=seed, layers=layers, perturb_norms=False)


def build_tiny_decoder(
    path: Path, family: str, *, seed: int = 0, layers: int = 2, perturb_norms: bool = True, tokenizer_options: dict[str, object] | None = None,
    **config_overrides: object,
) -> Path:
    """A tiny random decoder + tokenizer of a Llama-family architecture: "llama", "mistral",
    "qwen2" (GQA, q/k/v biases, untied), "qwen3" (GQA, per-head q/k norms, tied), with any
    config overrides (tied embeddings, rope scaling). `perturb_norms` draws norm weights and
    biases at random (transformers initialises them to ones and zeros, which would hide a
    loader that drops them)."""
    import torch
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    classes = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    }
    config_cls, model_cls = classes[family]
    tokenizer = build_tokenizer(path, **(tokenizer_options or {}))  # type: ignore[arg-type]
    settings: dict[str, object] = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if family == "qwen3":
        settings.update(head_dim=32, tie_word_embeddings=True)  # head_dim != hidden / heads, as in real Qwen3
    settings.update(config_overrides)
    config = config_cls(**settings)
    torch.manual_seed(seed)
    model = model_cls(config)
    with torch.no_grad():
        # Random init puts near-ties everywhere; a wider spread of logits makes greedy decoding
        # well defined so token-identity comparisons test the engine, not float noise.
        model.get_output_embeddings().weight.mul_(8.0)
        for name, param in model.named_parameters():
            if perturb_norms and (name.endswith("_proj.bias") or name.endswith("norm.weight")):
                param.normal_(mean=1.0 if name.endswith("norm.weight") else 0.0, std=0.2)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(path)
    return path


def build_noisy_copy(target: Path, path: Path, *, noise: float = 0.1, seed: int = 0) -> Path:
    """A different model with `target`'s tokenizer and shape: its weights plus Gaussian noise of
    `noise` times each tensor's spread (0.1 on the tiny Llama: a draft model whose greedy token
    is the target's about half the time)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    path.mkdir(parents=True, exist_ok=True)
    for file in target.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, path / file.name)
    generator = torch.Generator().manual_seed(seed)
    tensors = load_file(str(target / "model.safetensors"))
    noisy = {name: t + noise * t.std() * torch.randn(t.shape, generator=generator) for name, t in tensors.items()}
    save_file(noisy, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
