"""GGUF files as llama.cpp users make them, for the serve-a-GGUF-by-path tests.

`convert` runs llama.cpp's own `convert_hf_to_gguf.py` (from the pinned llama-cpp-python
sdist, tests/support/family_assets.py, on its own vendored gguf package) on a Hugging Face
directory: `f16` or `q8_0`; other block types come from ops/harness/gguf_files.py's `requantize`
(`llama-quantize` is not built in CI).
"""

from __future__ import annotations

from pathlib import Path

from ops.harness import gguf_files
from ops.harness.gguf_files import requantize
from tests.support.family_assets import llama_cpp_file

__all__ = ["convert", "requantize"]


def convert(hf_dir: Path, out: Path, outtype: str) -> Path:
    return gguf_files.convert(llama_cpp_file("convert_hf_to_gguf.py"), hf_dir, out, outtype)
