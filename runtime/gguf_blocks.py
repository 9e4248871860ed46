"""A GGUF checkpoint's quantized tensors as shipped, kept beside their dense conversion.

Owns: reading the Q4_0, Q4_1 and Q8_0 tensors of a llama-architecture GGUF file block by block
(no dequantization; Q4_0 as the Q4_1 blocks of the same weights), under transformers' names and row order, and writing them into the model
store as `shipped.safetensors` next to the dense `model.safetensors` the store already holds,
after checking that they dequantize to exactly those dense weights.

Stored per tensor `NAME`, blocks of 32 along the input dimension (rows are output features):
  NAME.q4_1.qs  uint8 [N, K / 2]   q of columns 2j (low nibble) and 2j + 1 (high nibble)
  NAME.q4_1.d   float16 [N, K / 32]
  NAME.q4_1.m   float16 [N, K / 32]
  NAME.q8_0.qs  int8 [N, K]
  NAME.q8_0.d   float16 [N, K / 32]
Tensors of any other type (F32 norms) are not repeated here: the dense file has them exactly.
numpy, gguf and safetensors only, imported when a conversion runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SHIPPED_FILE = "shipped.safetensors"
BLOCK_TYPES = {2, 3, 8}  # ggml's Q4_0, Q4_1, Q8_0: kept as shipped
FORMAT = "switchyard-shipped/1"
BLOCK = 32

# GGUF tensor name (after "blk.N.") -> transformers' name (after "model.layers.N.")
_LAYER_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight"}


def hf_name(gguf_name: str) -> str | None:
    """transformers' name of a GGUF linear or embedding tensor; None for any other tensor."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


# Block formats (ggml): Q4_1 is 32 weights per block as an fp16 scale d, an fp16 minimum m and
# 32 4-bit quants q (byte j holds q[j] low and q[j + 16] high), w = d * q + m; Q8_0 is an fp16
# scale d and 32 int8 quants, w = d * q.
def unpack_q4_1(blocks: Any) -> tuple[Any, Any, Any]:
    """Q4_1 bytes `[N, K / 32 * 20]` -> q uint8 `[N, K]` (0..15), d and m float16 `[N, K / 32]`."""
    import numpy as np

    n = blocks.shape[0]
    b = np.ascontiguousarray(blocks).reshape(n, -1, 20)
    d = b[..., 0:2].copy().view(np.float16)[..., 0]
    m = b[..., 2:4].copy().view(np.float16)[..., 0]
    qs = b[..., 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # per block: q[0..15] low nibbles, q[16..31] high
    return q.reshape(n, -1), d, m


def unpack_q4_0(blocks: Any) -> tuple[Any, Any, Any]:
    """Q4_0 bytes `[N, K / 32 * 18]` (w = d * (q - 8)) -> Q4_1's q, d and m = -8 d: the same
    weights exactly (8 d is exact in float16, and d * q - 8 d = d * (q - 8) in float32)."""
    import numpy as np

    n = blocks.shape[0]
    b = np.ascontiguousarray(blocks).reshape(n, -1, 18)
    d = b[..., 0:2].copy().view(np.float16)[..., 0]
    qs = b[..., 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    return q.reshape(n, -1), d, (d * np.float16(-8)).astype(np.float16)


def unpack_q8_0(blocks: Any) -> tuple[Any, Any]:
    """Q8_0 bytes `[N, K / 32 * 34]` -> q int8 `[N, K]`, d float16 `[N, K / 32]`."""
    import numpy as np

    n = blocks.shape[0]
    b = np.ascontiguousarray(blocks).reshape(n, -1, 34)
    d = b[..., 0:2].copy().view(np.float16)[..., 0]
    return b[..., 2:].copy().view(np.int8).reshape(n, -1), d


def pack_pairs(q: Any) -> Any:
    """uint8 `[N, K]` of 0..15 -> `[N, K / 2]`, column 2j in the low nibble, 2j + 1 in the high."""
    return q[:, 0::2] | (q[:, 1::2] << 4)


# llama.cpp's converter permutes the rows of q and k (its rotary pairs interleaved, transformers'
# in halves); transformers reverses that when it loads a GGUF, so the same row permutation is
# applied here. It moves whole rows, so blocks stay intact.
def unpermute_rows(x: Any, heads: int) -> Any:
    """transformers' `_reverse_permute_weights` on the rows of any per-row array."""
    shape = x.shape
    return x.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(2, 1).reshape(shape)


# GGUF metadata value types (ggml's gguf.md): fixed sizes, 8 a string, 9 an array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def _value(buf: memoryview, pos: int, kind: int) -> tuple[Any, int]:
    """One metadata value at `pos` and the position after it (arrays are skipped: None)."""
    import struct

    if kind == _STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return bytes(buf[pos + 8 : pos + 8 + n]).decode("utf-8", "replace"), pos + 8 + n
    if kind != _ARRAY:
        return struct.unpack_from(_SCALARS[kind], buf, pos)[0], pos + struct.calcsize(_SCALARS[kind])
    item, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if item != _STRING and item != _ARRAY:
        return None, pos + count * struct.calcsize(_SCALARS[item])
    for _ in range(count):
        pos = _value(buf, pos, item)[1]
    return None, pos


def _mapped(gguf_path: Path) -> memoryview:
    import mmap

    with open(gguf_path, "rb") as f:
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))  # pages read as used


def _header(buf: memoryview, name: str) -> tuple[dict[str, Any], list[tuple[str, Any, int, int]], int]:
    """Scalar metadata, each tensor's (name, ggml shape, type, offset) and where tensor data starts."""
    import struct

    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    if magic != b"GGUF" or version < 2:
        raise ValueError(f"{name}: not a GGUF v2+ file")
    pos, meta = 24, {}
    for _ in range(n_kv):
        key, pos = _value(buf, pos, _STRING)
        (kind,), pos = struct.unpack_from("<I", buf, pos), pos + 4
        meta[key], pos = _value(buf, pos, kind)
    infos = []
    for _ in range(n_tensors):
        tensor, pos = _value(buf, pos, _STRING)
        (dims,) = struct.unpack_from("<I", buf, pos)
        shape = struct.unpack_from(f"<{dims}Q", buf, pos + 4)  # ggml order: the row length first
        kind, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * dims)
        infos.append((tensor, shape, kind, offset))
        pos += 4 + 8 * dims + 12
    align = int(meta.get("general.alignment") or 32)
    return meta, infos, -(-pos // align) * align


def tokenizer_key(gguf_path: Path) -> str:
    """A digest of the file's tokenizer metadata (every `tokenizer.*` key, vocabulary and merges
    included, and the architecture): files with the same digest convert to the same tokenizer."""
    import hashlib
    import struct

    buf = _mapped(gguf_path)
    n_kv = struct.unpack_from("<4sIQQ", buf, 0)[3]
    digest, pos = hashlib.blake2b(digest_size=16), 24
    for _ in range(n_kv):
        start = pos
        key, pos = _value(buf, pos, _STRING)
        (kind,) = struct.unpack_from("<I", buf, pos)
        pos = _value(buf, pos + 4, kind)[1]
        if key.startswith("tokenizer.") or key == "general.architecture":
            digest.update(buf[start:pos])
    return digest.hexdigest()


def metadata(gguf_path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """A GGUF file's scalar metadata and each tensor's ggml type, from its header alone
    (ValueError naming the file when it is not one, or cut short)."""
    import struct

    try:
        meta, infos, _ = _header(_mapped(gguf_path), gguf_path.name)
    except (struct.error, KeyError, IndexError, UnicodeDecodeError):
        raise ValueError(f"{gguf_path.name}: not a GGUF v2+ file (its header is cut short or malformed)") from None
    return meta, {tensor: kind for tensor, _, kind, _ in infos}


def read_tensors(gguf_path: Path) -> tuple[dict[str, Any], dict[str, tuple[int, Any]]]:
    """A GGUF file's scalar metadata, and each tensor's (ggml type, raw bytes `[rows, row bytes]`).

    The `gguf` package's reader builds every metadata array (the vocabulary: ~100k strings),
    which took 3-6 s of the conversion for nothing read here; this walks past them."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    buf = _mapped(gguf_path)
    meta, infos, start = _header(buf, gguf_path.name)
    tensors = {}
    for name, shape, kind, offset in infos:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        rows, row_bytes = int(np.prod(shape[1:], dtype=np.int64)), shape[0] // block * size
        data = np.frombuffer(buf, dtype=np.uint8, count=rows * row_bytes, offset=start + offset)
        tensors[name] = (kind, data.reshape(rows, row_bytes))
    return meta, tensors


def read_blocks(gguf_path: Path) -> dict[str, Any]:
    """The file's Q4_0, Q4_1 and Q8_0 tensors as `shipped.safetensors` arrays (module docstring)."""
    from gguf import GGMLQuantizationType

    meta, tensors = read_tensors(gguf_path)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{gguf_path.name}: architecture {arch!r}, not llama (q/k rows would need another mapping)")
    heads = int(meta["llama.attention.head_count"])
    kv_heads = int(meta["llama.attention.head_count_kv"])
    row_heads = {".self_attn.q_proj.": heads, ".self_attn.k_proj.": kv_heads}
    out: dict[str, Any] = {}
    for gguf_name, (kind, data) in tensors.items():
        name = hf_name(gguf_name)
        if name is None or kind not in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0):
            continue
        if kind in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1):
            q, d, m = (unpack_q4_0 if kind == GGMLQuantizationType.Q4_0 else unpack_q4_1)(data)
            arrays = {"q4_1.qs": q, "q4_1.d": d, "q4_1.m": m}
        else:
            q8, d = unpack_q8_0(data)
            arrays = {"q8_0.qs": q8, "q8_0.d": d}
        permuted = next((h for key, h in row_heads.items() if key in name), None)
        for key, array in arrays.items():
            array = array if permuted is None else unpermute_rows(array, permuted)
            out[f"{name}.{key}"] = pack_pairs(array) if key == "q4_1.qs" else array
    return out


def dequantize(arrays: dict[str, Any], name: str) -> Any:
    """float32 `[N, K]` of one stored tensor, as gguf's own dequantization computes it."""
    import numpy as np

    if f"{name}.q4_1.qs" in arrays:
        packed = arrays[f"{name}.q4_1.qs"]
        q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[0], -1).astype(np.float32)
        d = np.repeat(arrays[f"{name}.q4_1.d"].astype(np.float32), BLOCK, axis=1)
        m = np.repeat(arrays[f"{name}.q4_1.m"].astype(np.float32), BLOCK, axis=1)
        return d * q + m
    d = np.repeat(arrays[f"{name}.q8_0.d"].astype(np.float32), BLOCK, axis=1)
    return arrays[f"{name}.q8_0.qs"].astype(np.float32) * d


def stored_names(arrays: dict[str, Any]) -> list[str]:
    return sorted({key.rsplit(".", 2)[0] for key in arrays})


def parameter_count(gguf_path: Path) -> int:
    """How many weights the file holds, from its header."""
    import math

    _, infos, _ = _header(_mapped(gguf_path), gguf_path.name)
    return sum(math.prod(shape) for _, shape, _, _ in infos)


def _dense_tensors(path: Path) -> dict[str, Any]:
    """A safetensors file's F32 tensors, and its BF16 ones as their uint16 bits (numpy has no
    bf16), read from its header and mapped buffer."""
    import numpy as np

    raw = _mapped(path)
    size = int.from_bytes(raw[:8], "little")
    out = {}
    for name, info in json.loads(bytes(raw[8 : 8 + size])).items():
        if name == "__metadata__" or info["dtype"] not in ("F32", "BF16"):
            continue
        kind = np.dtype(np.float32 if info["dtype"] == "F32" else np.uint16)
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(raw, dtype=kind, count=(end - start) // kind.itemsize, offset=8 + size + start).reshape(info["shape"])
    return out


def _reproduces(values: Any, stored: Any) -> bool:
    """The store holds the blocks' values: exactly in float32, rounded to the nearest bf16 (ties
    to even) in bf16; as numbers (a zero may be stored as -0)."""
    import numpy as np

    if stored.dtype == np.float32:
        return bool(np.array_equal(values, stored))
    bits = values.astype(np.float32).view(np.uint32)
    nearest = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bool(np.array_equal(nearest.view(np.float32), (stored.astype(np.uint32) << 16).view(np.float32)))


def write_shipped(gguf_path: Path, out_dir: Path) -> None:
    """`shipped.safetensors` in `out_dir`, whose `model.safetensors` (transformers'
    dequantization of the same file, float32 or bf16) every stored tensor must reproduce
    (`_reproduces`). The served rows read the blocks (and their own bf16 rounding for wide
    calls, actors/runners/native/rowwise.py), not this dense copy."""
    import numpy as np
    from safetensors.numpy import save_file

    arrays = read_blocks(gguf_path)
    types = {}
    dense = _dense_tensors(out_dir / "model.safetensors")
    for name in stored_names(arrays):
        if name not in dense or not _reproduces(dequantize(arrays, name), dense[name]):
            raise ValueError(f"{gguf_path.name}: {name} does not dequantize to the converted weights")
        types[name] = "q4_1" if f"{name}.q4_1.qs" in arrays else "q8_0"
    metadata = {"format": FORMAT, "source": gguf_path.name, "types": json.dumps(types)}
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(out_dir / SHIPPED_FILE), metadata=metadata)
