"""Fixtures every tier shares: the tiny model and its tokenizer, built on disk in-process.

The tests sit on one axis, by what they run: unit/ (code on its own), engine/ (the engine
in-process), server/ (the real app on a loopback socket), cluster/ (Ray Serve), e2e/ (the
real default model), checks/ (static checks). Each tier's own fixtures are in its conftest.py;
the helpers they are built from are in tests/support/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny model's tokenizer alone (a fresh one per module), for grammar and tokenizer tests."""
    from tests.support.tiny_model import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tok"))
