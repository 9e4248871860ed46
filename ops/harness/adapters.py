"""PEFT LoRA adapters made in-process on a base model, for the LoRA bench and tests.

`make_adapter` gives A and B random values at `std` (PEFT starts B at zero: an adapter that
changes nothing) and saves PEFT's directory (`adapter_config.json`, `adapter_model.safetensors`).
"""

from __future__ import annotations

from pathlib import Path


def make_adapter(base: Path, out: Path, seed: int, std: float, **fields: object) -> Path:
    """A PEFT adapter on `base` with LoraConfig `fields`, its weights drawn at `std`, saved to `out`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), LoraConfig(init_lora_weights=False, **fields))  # type: ignore[arg-type]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, std)
    model.save_pretrained(str(out))
    return out
