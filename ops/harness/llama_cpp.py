"""llama.cpp's own tools (`llama-quantize`, `llama-server`), built once from the pinned sdist.

    python -m ops.harness.llama_cpp [--targets llama-quantize,llama-server] [--jobs 2]

Downloads the llama-cpp-python sdist at the version the tests pin for its templates and
converter (tests/support/family_assets.py `LLAMA_CPP`: the same llama.cpp), unpacks it under
`~/.cache/switchyard/llama.cpp/<version>` (or `$SWITCHYARD_LLAMA_CPP`), configures it as
ops/bench/README.md says (`GGML_NATIVE` for this CPU, AMX and curl off) and builds the targets
at nice 19; prints each binary's path. `tool(name)` gives a built binary's path, or None: the
tests that use one (a Q4_K file from `llama-quantize`, tests/engine/test_gguf_by_path.py) run
where it was built and skip elsewhere. CI builds nothing: a configure and the quantizer take
a few minutes on 2 cores, llama-server ~19.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python, as tests/support/family_assets.py pins it
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_NATIVE=ON", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
]  # fmt: skip


def root() -> Path:
    return Path(os.environ.get("SWITCHYARD_LLAMA_CPP") or Path.home() / ".cache" / "switchyard" / "llama.cpp") / VERSION


def tool(name: str) -> Path | None:
    """The built binary `name` (e.g. "llama-quantize"), or None where it was never built."""
    path = root() / "build" / "bin" / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def source() -> Path:
    """The vendored llama.cpp source tree, unpacked once."""
    tree = root() / "src"
    if not (tree / "CMakeLists.txt").exists():
        with tempfile.TemporaryDirectory() as tmp:
            pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", f"llama-cpp-python=={VERSION}", "-d", tmp]
            subprocess.run(pip, check=True, timeout=900)
            with tarfile.open(next(Path(tmp).iterdir())) as tar:
                tar.extractall(tmp, filter="data")
            vendored = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
            tree.parent.mkdir(parents=True, exist_ok=True)
            vendored.rename(tree)
    return tree


def build(targets: list[str], jobs: int = 2) -> list[Path]:
    """Configure once, build `targets`; their paths."""
    tree, out = source(), root() / "build"
    nice = ["nice", "-n", "19"]
    if not (out / "CMakeCache.txt").exists():
        subprocess.run([*nice, "cmake", "-S", str(tree), "-B", str(out), *CMAKE_FLAGS], check=True, timeout=1800)
    for target in targets:
        subprocess.run([*nice, "cmake", "--build", str(out), "--target", target, "-j", str(jobs)], check=True, timeout=3600)
    return [out / "bin" / target for target in targets]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--targets", default="llama-quantize", help="comma-separated cmake targets")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    for path in build(args.targets.split(","), args.jobs):
        print(path)


if __name__ == "__main__":
    main()
