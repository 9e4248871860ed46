"""Fixtures for the generation-control tests (sampling, lengths and stops, logprobs, n and best_of).

The server under test is the shared `server` fixture (tests/server/conftest.py: tiny random
Llama served as "tiny", float32, block size 4, max_model_len 512), with its `http` and
`client`. `ref` is the same checkpoint in transformers, the oracle the tests compare the
server with (tests/support/reference.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.reference import Reference


@pytest.fixture(scope="session")
def ref(tiny_model_dir: Path) -> Reference:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return Reference(tokenizer=tokenizer, model=model)
