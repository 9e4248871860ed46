"""Fixtures for the generation-control tests (GitHub issue 3).

The server under test is the shared `server` fixture (tests/conftest.py: tiny random Llama
served as "tiny", float32, block size 4, max_model_len 512). `ref` is the same checkpoint in
transformers, the oracle the tests compare the server with.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch

from tests.conftest import Server
from tests.generation.helpers import Reference


@pytest.fixture(scope="session")
def ref(tiny_model_dir: Path) -> Reference:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return Reference(tokenizer=tokenizer, model=model)


@pytest.fixture
async def http(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        yield client


@pytest.fixture
def client(server: Server) -> Iterator[openai.OpenAI]:
    # Closed after each test: an idle keep-alive connection would hold up server teardown.
    with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c
