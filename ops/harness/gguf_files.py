"""GGUF files made here, for the tests and benches that serve a GGUF by path.

`convert` runs llama.cpp's own `convert_hf_to_gguf.py` (given where it is) on a Hugging Face
directory: `f16`, `bf16` or `q8_0`. `requantize` rewrites an f16 GGUF's matrices as Q4_0, Q4_1 or Q8_0 blocks with the gguf
package's quantizers (llama.cpp's reference rounding; every matrix, as `llama-quantize --pure`
does), everything else kept, or as K-quant blocks (Q4_K, Q5_K, Q6_K) of random quants under
valid scales where rows are a multiple of 256: the gguf package has no K-quantizer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any


def convert(converter: Path, hf_dir: Path, out: Path, outtype: str) -> Path:
    run = subprocess.run([sys.executable, str(converter), str(hf_dir), "--outfile", str(out), "--outtype", outtype], capture_output=True, text=True, timeout=1800)
    if run.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf failed: {run.stderr[-3000:]}")
    return out


def requantize(f16: Path, out: Path, kind: str) -> Path:
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType, quants

    qtype = GGMLQuantizationType[kind.upper()]
    reader = GGUFReader(str(f16))
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=field.types[-1] if vtype == GGUFValueType.ARRAY else None)
    writer.add_file_type(LlamaFileType[{"q4_k": "MOSTLY_Q4_K_M", "q5_k": "MOSTLY_Q5_K_M"}.get(kind, f"MOSTLY_{kind.upper()}")])
    rng = np.random.default_rng(0)
    for tensor in reader.tensors:
        data = np.array(tensor.data)
        if tensor.tensor_type == GGMLQuantizationType.F16 and data.ndim == 2 and (kind in QUANTIZED or data.shape[1] % 256 == 0):  # K-quants: rows of 256
            blocks = quants.quantize(data.astype(np.float32), qtype) if kind in QUANTIZED else _k_blocks(rng, data.shape, qtype)
            writer.add_tensor(tensor.name, blocks, raw_dtype=qtype)
        else:
            writer.add_tensor(tensor.name, data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


QUANTIZED = ("q4_0", "q4_1", "q8_0")  # what the gguf package quantizes; K-quants it only reads


def _k_blocks(rng: Any, shape: tuple[int, ...], qtype: Any) -> Any:
    """A K-quant tensor of random quants under small, finite float16 scales: not the matrix's
    rounding (no K-quantizer here), a valid file whose dequantization transformers and this
    server must agree on."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(shape[0], shape[1] // block, size), dtype=np.uint8)
    scale = np.array([0.002], dtype=np.float16).view(np.uint8)
    d_at = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (size - 2,)}[qtype.name]  # d (and dmin) offsets
    for at in d_at:
        raw[..., at : at + 2] = scale
    return raw.reshape(shape[0], -1)
