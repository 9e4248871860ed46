"""GGUF files as llama.cpp users make them, for the serve-a-GGUF-by-path tests.

`convert` runs llama.cpp's own `convert_hf_to_gguf.py` (from the pinned llama-cpp-python
sdist, tests/support/family_assets.py, on its own vendored gguf package) on a Hugging Face
directory: `f16` or `q8_0`; other block types come from ops/harness/gguf_files.py's `requantize`,
or from llama.cpp's own `llama-quantize` (`quantize`) where ops/harness/llama_cpp.py built it
(CI builds none: None there).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ops.harness import gguf_files
from ops.harness.gguf_files import requantize
from ops.harness.llama_cpp import VERSION, tool
from tests.support.family_assets import LLAMA_CPP, llama_cpp_file

__all__ = ["convert", "quantize", "requantize"]


def convert(hf_dir: Path, out: Path, outtype: str) -> Path:
    return gguf_files.convert(llama_cpp_file("convert_hf_to_gguf.py"), hf_dir, out, outtype)


def quantize(f16: Path, out: Path, kind: str) -> Path | None:
    """`llama-quantize f16 out KIND` (e.g. "Q4_K_M"), as llama.cpp users make their files; None
    where the tool was never built (`python -m ops.harness.llama_cpp`)."""
    binary = tool("llama-quantize")
    if binary is None:
        return None
    assert VERSION == LLAMA_CPP[1], "the quantizer and the converter come from one llama.cpp"
    subprocess.run([str(binary), str(f16), str(out), kind], check=True, capture_output=True, timeout=600)
    return out
