"""A GGUF's blocks as shipped (runtime/gguf_blocks.py) and on the int4 kernel (native/shipped.py).

- Read from a tiny GGUF written as llama.cpp writes one (q/k rows permuted), the Q4_1 and Q8_0
  blocks dequantize exactly to what the `gguf` package dequantizes, in transformers' row order;
  F32 tensors are left to the dense file.
- aten's int4 kernel with scale = d and zero = m + 8 d computes x @ (d q + m)^T, float32 to
  rounding; a Q8_0 tensor, split into high and low nibbles over [x, x], computes x @ (d q)^T.
- The store refuses blocks that do not dequantize to its dense weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from actors.runners.native import quant, shipped
from runtime import gguf_blocks
from tests.support.tiny_gguf import qtype_of, write_gguf

HEADS, KV_HEADS = 4, 2


def _tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {
        "model.layers.0.self_attn.q_proj.weight": (64, 64),
        "model.layers.0.self_attn.k_proj.weight": (32, 64),
        "model.layers.0.mlp.down_proj.weight": (64, 128),
        "model.layers.0.input_layernorm.weight": (64,),
        "model.embed_tokens.weight": (96, 64),
    }
    # an offset per row, so the Q4_1 minimum is not ~ -the maximum
    return {n: (rng.standard_normal(s) * 0.05 + (rng.standard_normal((s[0], 1)) * 0.02 if len(s) == 2 else 1)).astype(np.float32) for n, s in shapes.items()}


def test_blocks_dequantize_to_the_gguf_packages_dequantization_in_transformers_row_order(tmp_path: Path) -> None:
    import gguf

    tensors = _tensors()
    arrays = gguf_blocks.read_blocks(write_gguf(tmp_path / "tiny.gguf", tensors, HEADS, KV_HEADS))
    assert gguf_blocks.stored_names(arrays) == sorted(n for n in tensors if not n.endswith("norm.weight"))
    for name in gguf_blocks.stored_names(arrays):
        qtype = qtype_of(name)
        # row by row quantization commutes with llama.cpp's row permutation: the original rows' blocks
        expected = gguf.quants.dequantize(gguf.quants.quantize(tensors[name], qtype), qtype)
        assert np.array_equal(gguf_blocks.dequantize(arrays, name), expected), name
        assert not np.array_equal(expected, tensors[name])  # the blocks really are 4 or 8 bits
    q = arrays["model.layers.0.self_attn.q_proj.weight.q4_1.qs"]
    assert q.dtype == np.uint8 and q.shape == (64, 32)
    assert arrays["model.embed_tokens.weight.q8_0.qs"].dtype == np.int8


def _q4_1_blocks(w: np.ndarray) -> dict[str, torch.Tensor]:
    import gguf

    q, d, m = gguf_blocks.unpack_q4_1(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1))
    return {"w.q4_1.qs": torch.from_numpy(gguf_blocks.pack_pairs(q)), "w.q4_1.d": torch.from_numpy(d), "w.q4_1.m": torch.from_numpy(m)}


def _q8_0_blocks(w: np.ndarray) -> dict[str, torch.Tensor]:
    import gguf

    q, d = gguf_blocks.unpack_q8_0(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0))
    return {"w.q8_0.qs": torch.from_numpy(q), "w.q8_0.d": torch.from_numpy(d)}


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_the_int4_kernel_computes_the_shipped_blocks_product(fmt: str) -> None:
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((96, 128)) * 0.05 + rng.standard_normal((96, 1)) * 0.02).astype(np.float32)
    blocks = _q4_1_blocks(w) if fmt == "q4_1" else _q8_0_blocks(w)
    exact = torch.from_numpy(gguf_blocks.dequantize({k: v.numpy() for k, v in blocks.items()}, "w"))
    x = torch.from_numpy(rng.standard_normal((3, 128)).astype(np.float32))
    linear = quant.QuantLinear(max_rows=8)  # 3 rows: the weight-only kernel
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 0.02)):
        dense = exact.to(dtype)
        weight = (shipped.q4_1_weight(blocks, ["w"], dense, None) if fmt == "q4_1" else shipped.q8_0_weight(blocks, "w", dense, None))
        assert weight.bits == 4 and weight.doubled == (fmt == "q8_0")
        out = linear(x.to(dtype), weight, None).float()
        expected = x.to(dtype).float() @ exact.T
        assert ((out - expected).norm() / expected.norm()) < tolerance, (dtype, fmt)
    # and the blocks are not a requantization: the float32 kernel matches d q (+ m) itself
    weight32 = shipped.q4_1_weight(blocks, ["w"], exact, None) if fmt == "q4_1" else shipped.q8_0_weight(blocks, "w", exact, None)
    columns = quant.QuantLinear(max_rows=10**9)(torch.eye(128), weight32, None).T  # weight-only at 128 rows too
    assert torch.allclose(columns, exact, rtol=0, atol=1e-6)


def test_the_store_refuses_blocks_that_do_not_dequantize_to_its_dense_weights(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    tensors = _tensors()
    gguf_path = write_gguf(tmp_path / "tiny.gguf", tensors, HEADS, KV_HEADS)
    arrays = gguf_blocks.read_blocks(gguf_path)
    dense = {name: gguf_blocks.dequantize(arrays, name) for name in gguf_blocks.stored_names(arrays)}
    save_file(dense, str(tmp_path / "model.safetensors"))
    gguf_blocks.write_shipped(gguf_path, tmp_path)
    assert (tmp_path / gguf_blocks.SHIPPED_FILE).is_file()
    # a permutation left undone is the likely bug: k rows in llama.cpp's order
    dense["model.layers.0.self_attn.k_proj.weight"] = dense["model.layers.0.self_attn.k_proj.weight"][::-1].copy()
    save_file(dense, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="k_proj"):
        gguf_blocks.write_shipped(gguf_path, tmp_path)
