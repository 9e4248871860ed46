"""Hugging Face safetensors → the native model's fused weights.

Owns: reading a checkpoint's tensors (one file or an index of shards; an FP8 checkpoint's
blocks dequantized, `dequantize_fp8`), casting them to the serving dtype, and the fused layout
the native model runs (`LayerWeights`: q/k/v as one `[(H + 2 KVH) * d, D]` matrix and bias,
gate/up as one `[2 I, D]` matrix), the embedding, final norm and lm_head (tied to the
embedding when the checkpoint says so or ships none).
Each layer's names are its family's (`layer_weights` in the family module, families.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from actors.runners.native.config import NativeConfig
from runtime.gguf_blocks import SHIPPED_FILE


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor  # [D]
    qkv: torch.Tensor  # [(H + 2 KVH) * d, D]
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # [d] (Qwen3)
    k_norm: torch.Tensor | None
    o_proj: torch.Tensor  # [D, H * d]
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor  # [D]
    gate_up: torch.Tensor  # [2 I, D]
    down: torch.Tensor  # [D, I]
    index: int = 0  # its place in the stack (LoRA adapters key on it: native/lora.py)


@dataclass(slots=True)
class ModelWeights:
    embed: torch.Tensor  # [V, D]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [D]
    lm_head: torch.Tensor  # [V, D]; the embedding itself when tied


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / name for name in shards]
    # The quantized blocks beside the dense conversion are read by shipped.py, not here.
    files = sorted(p for p in model_dir.glob("*.safetensors") if p.name != SHIPPED_FILE)
    if not files:
        raise FileNotFoundError(f"{model_dir}: no .safetensors weights (the native path reads safetensors only)")
    return files


def read_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in checkpoint_files(model_dir):
        tensors.update(load_file(str(path)))
    return dequantize_fp8(tensors)


FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def dequantize_fp8(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each float8 `X.weight` times its `X.weight_scale_inv` (a grid of blocks, as Qwen3-FP8 and
    DeepSeek ship them, or one scale for the tensor) in float32, as transformers dequantizes an
    FP8 checkpoint (`Fp8Dequantize`); activation scales dropped, as there. A float8 tensor with
    no scale, or a grid that does not divide it, is an error: nothing is read as plain weights."""
    for name in [n for n in tensors if n.endswith(".weight_scale_inv")]:
        scales = tensors.pop(name).float()
        weight = name.removesuffix("_scale_inv")
        quantized = tensors[weight].float()
        rows, cols = quantized.shape
        grid_rows, grid_cols = scales.shape if scales.ndim == 2 else (1, 1)
        if rows % grid_rows or cols % grid_cols:
            raise ValueError(f"{weight}: shape {(rows, cols)} is not a whole number of its scale grid {(grid_rows, grid_cols)}")
        blocks = quantized.reshape(grid_rows, rows // grid_rows, grid_cols, cols // grid_cols)
        tensors[weight] = (blocks * scales.reshape(grid_rows, 1, grid_cols, 1)).reshape(rows, cols)
    for name in [n for n in tensors if n.endswith((".activation_scale", ".input_scale"))]:
        del tensors[name]
    left = [n for n, t in tensors.items() if t.dtype in FP8]
    if left:
        raise ValueError(f"float8 tensors without a weight_scale_inv: {left[:3]}")
    return tensors


# A family's reading of one layer: `take(name, required=True)` pops a tensor by its name under
# the checkpoint's prefix, cast and on the device (None when absent and not required).
Take = Callable[..., torch.Tensor | None]


def load_weights(
    model_dir: Path, cfg: NativeConfig, dtype: torch.dtype, device: torch.device, layer_weights: Callable[[Take, int], LayerWeights]
) -> ModelWeights:  # fmt: skip
    """The checkpoint's weights, each layer read by its family's `layer_weights`."""
    raw = read_tensors(model_dir)
    prefix = "model." if "model.embed_tokens.weight" in raw else ""

    def take(name: str, required: bool = True) -> torch.Tensor | None:
        tensor = raw.pop(prefix + name, None)
        if tensor is None:
            if required:
                raise KeyError(f"{model_dir}: checkpoint has no {prefix + name}")
            return None
        return tensor.to(device=device, dtype=dtype).contiguous()

    layers = [layer_weights(take, i) for i in range(cfg.num_layers)]
    embed = take("embed_tokens.weight")
    final_norm = take("norm.weight")
    head = raw.pop("lm_head.weight", None)
    lm_head = embed if cfg.tie_word_embeddings or head is None else head.to(device=device, dtype=dtype).contiguous()
    assert embed is not None and final_norm is not None and lm_head is not None
    return ModelWeights(embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head)
