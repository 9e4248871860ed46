"""Tiny LoRA adapters made with PEFT, and PEFT's own greedy output, for the adapter tests."""

from __future__ import annotations

from pathlib import Path

import torch

from ops.harness import adapters as harness
from tests.support.equivalence import NUM_NEW

ADAPTERS = {  # name → PEFT LoraConfig fields: two target-module sets, two ranks, one rsLoRA
    "qv-r4": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "qv-r8": dict(r=8, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "all-r4": dict(r=4, lora_alpha=4, target_modules="all-linear"),
    "all-r8": dict(r=8, lora_alpha=16, target_modules="all-linear", use_rslora=True),
}


def make_adapter(base: Path, out: Path, seed: int, **fields: object) -> Path:
    """A PEFT adapter with random A and B at a scale that changes the tiny model's answers."""
    return harness.make_adapter(base, out, seed, 0.3, **fields)


def peft_greedy(base: Path, adapter: Path | None, prompts: list[list[int]]) -> list[list[int]]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model = (PeftModel.from_pretrained(model, adapter) if adapter else model).eval()
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.inference_mode():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NUM_NEW, min_new_tokens=NUM_NEW, do_sample=False)
        out.append(gen[0, len(p) :].tolist())
    return out


def make_adapters(base: Path, root: Path) -> dict[str, Path]:
    """Every adapter of ADAPTERS on `base`, under `root`."""
    return {name: make_adapter(base, root / name, seed, **fields) for seed, (name, fields) in enumerate(ADAPTERS.items())}
