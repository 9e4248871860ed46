"""Fixtures every tier shares: the tiny model and its tokenizer, built on disk in-process.

The tests sit on one axis, by what they run: unit/ (code on its own), engine/ (the engine
in-process), server/ (the real app on a loopback socket), cluster/ (Ray Serve), e2e/ (the
real default model, and ops/gpu/check.sh's CPU dry run), checks/ (static checks). Each tier's
own fixtures are in its conftest.py; the helpers they are built from are in tests/support/.
The device the tiny models run on is tests/support/device.py's: the CPU unless
SWITCHYARD_TEST_DEVICE names a CUDA device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.device import ENV, on_gpu, suite_device
from tests.support.servers import split_engine


def pytest_report_header() -> str:
    return f"switchyard test device: {suite_device()} ({ENV})"


def pytest_configure(config: pytest.Config) -> None:
    """A CUDA test device torch cannot see ends the run at once, with one line: every engine
    test would otherwise fail on its own."""
    if on_gpu():
        import torch

        if not torch.cuda.is_available():
            pytest.exit(f"{ENV}={suite_device()} but torch {torch.__version__} sees no CUDA device", returncode=4)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """SWITCHYARD_TEST_ENGINE_PROCESS=1 (the server tier against --engine-process): tests that
    reach into the engine's objects in the server's process do not apply."""
    if not split_engine():
        return
    skip = pytest.mark.skip(reason="reaches into the in-process engine (SWITCHYARD_TEST_ENGINE_PROCESS=1)")
    for item in items:
        if item.get_closest_marker("in_process"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def llava_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random LLaVA (CLIP tower, Llama text tower) with its Pillow processor."""
    from tests.support.tiny_vlm import build_tiny_llava

    return build_tiny_llava(tmp_path_factory.mktemp("tiny-llava"))


@pytest.fixture(scope="session")
def qwen2_vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2-VL (M-RoPE) with its Pillow image processor."""
    from tests.support.tiny_vlm import build_tiny_qwen2_vl

    return build_tiny_qwen2_vl(tmp_path_factory.mktemp("tiny-qwen2-vl"))


@pytest.fixture(scope="session")
def qwen2_5_vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2.5-VL (window attention in its vision tower, M-RoPE) with its Pillow image processor."""
    from tests.support.tiny_vlm import build_tiny_qwen2_5_vl

    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen2-5-vl"))


@pytest.fixture(scope="session")
def idefics3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Idefics3 (SmolVLM: tiles and a global view) with its Pillow processor."""
    from tests.support.tiny_vlm import build_tiny_idefics3

    return build_tiny_idefics3(tmp_path_factory.mktemp("tiny-idefics3"))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny model's tokenizer alone (a fresh one per module), for grammar and tokenizer tests."""
    from tests.support.tiny_model import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="session")
def lora_adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny PEFT adapters on the tiny Llama, by name (tests/support/adapters.py)."""
    from tests.support.adapters import make_adapters

    return make_adapters(tiny_model_dir, tmp_path_factory.mktemp("adapters"))
