"""Tiny synthetic GGUF checkpoints: Q4_1 linears and a Q8_0 embedding, as llama.cpp writes them.

`write_gguf` writes a llama-architecture GGUF of given float matrices (under transformers'
names) the way llama.cpp's converter does: q/k rows permuted for its rotary layout, each tensor
quantized by the `gguf` package's own quantizer. `ship_tiny_model` turns a tiny transformers
model directory into a store entry like the embedded model's: its matrices replaced by their
Q4_1 (linears) / Q8_0 (embedding) dequantization in model.safetensors, and the blocks beside
them in shipped.safetensors (runtime/gguf_blocks.py, which checks they agree).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

GGUF_LAYER_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf `permute` of q/k rows (heads: the tensor's own head count)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{GGUF_LAYER_NAMES[rest]}"


def qtype_of(hf: str) -> Any:
    from gguf import GGMLQuantizationType

    if hf.endswith("norm.weight"):
        return GGMLQuantizationType.F32
    return GGMLQuantizationType.Q8_0 if "embed_tokens" in hf or hf == "lm_head.weight" else GGMLQuantizationType.Q4_1


def write_gguf(path: Path, tensors: dict[str, np.ndarray], heads: int, kv_heads: int) -> Path:
    """A GGUF file of float32 `tensors` (transformers' names), quantized per `qtype_of`."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    for name, w in tensors.items():
        w = w.astype(np.float32)
        if "q_proj" in name:
            w = llama_cpp_permute(w, heads)
        elif "k_proj" in name:
            w = llama_cpp_permute(w, kv_heads)
        qtype = qtype_of(name)
        data = gguf.quants.quantize(w, qtype)
        writer.add_tensor(gguf_name(name), data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def ship_tiny_model(model_dir: Path) -> Path:
    """`model_dir` (a tiny transformers Llama) as the store keeps a shipped-quantized model."""
    from safetensors.numpy import load_file, save_file

    from runtime import gguf_blocks

    config = __import__("json").loads((model_dir / "config.json").read_text())
    dense = load_file(str(model_dir / "model.safetensors"))
    chosen = {n: w for n, w in dense.items() if n.endswith(".weight") and (n.startswith("model.layers.") or "embed_tokens" in n or n == "lm_head.weight")}
    gguf_path = write_gguf(model_dir.parent / f"{model_dir.name}.gguf", chosen, config["num_attention_heads"], config["num_key_value_heads"])
    blocks = gguf_blocks.read_blocks(gguf_path)
    for name in gguf_blocks.stored_names(blocks):
        dense[name] = gguf_blocks.dequantize(blocks, name)  # the dense upcast of the shipped weights
    save_file(dense, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    gguf_blocks.write_shipped(gguf_path, model_dir)
    return model_dir
