"""End-to-end on the embedded default model (SmolLM2-135M-Instruct): slow, real weights.

- Greedy output is token-identical to transformers' generate() for 8 prompts of different
  lengths sent concurrently and staggered, both stopping at EOS (float32 on both sides: in bf16 the packed batch
  and transformers' padded batch round differently, and near-ties can flip argmax).
- The official openai client drives chat and completions, streaming and not, on the default
  configuration: on CPU that serves the GGUF's own Q4_1 blocks on the row-invariant kernels
  (`model_impl` native+q4_1+rowwise).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import openai
import pytest
import torch
import trio
from transformers import AutoModelForCausalLM, AutoTokenizer

from actors.build import build_engine
from runtime.model_store import resolve_model
from runtime.request import Prompt
from runtime.sampling import SamplingParams
from tests.support.device import kernels_build
from tests.support.servers import Server, default_config, start_server
from tests.support.waiting import in_thread

pytestmark = pytest.mark.slow

PROMPTS = [
    "Hi",
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):\n    ",
    "List three colours: red,",
    "In 1492, Christopher Columbus sailed across the Atlantic Ocean and reached the islands of the",
    "Question: What is two plus two?\nAnswer:",
    "The mitochondria is the powerhouse of the cell. It produces energy in the form of ATP through a process called",
]
NUM_NEW = 24


@pytest.fixture(scope="module")
def model_dir():  # type: ignore[no-untyped-def]
    return resolve_model(None)[1]


async def test_greedy_matches_transformers_on_default_model(model_dir) -> None:  # type: ignore[no-untyped-def]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    expected = []
    for ids in prompts:
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NUM_NEW, do_sample=False)
        expected.append(out[0, len(ids) :].tolist())
    del model

    runtime = build_engine(default_config())
    got: list[list[int]] = [[] for _ in prompts]

    async def one(i: int) -> None:
        await trio.sleep(0.05 * i)
        sampling = SamplingParams(temperature=0.0, max_tokens=NUM_NEW)
        async with runtime.submit(Prompt(token_ids=prompts[i]), sampling) as stream:
            async for delta in stream:
                got[i] += delta.token_ids

    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.run)
        async with trio.open_nursery() as clients:
            for i in range(len(prompts)):
                clients.start_soon(one, i)
        stats = runtime.statistics()
        nursery.cancel_scope.cancel()
    for i in range(len(prompts)):
        assert got[i] == expected[i], f"prompt {i} {PROMPTS[i]!r}: {tokenizer.decode(got[i])!r} != {tokenizer.decode(expected[i])!r}"
    assert stats["kv_blocks_used"] == 0 and stats["requests"] == 0


@pytest.fixture
async def real_server() -> AsyncIterator[Server]:
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, default_config(dtype="auto"))
        yield srv
        srv.stop.set()


@pytest.fixture
def client(real_server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=real_server.openai_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


async def test_openai_client_chat_and_completions_on_default_model(real_server: Server, client: openai.OpenAI) -> None:
    models = await in_thread(client.models.list)
    card = next(m for m in models.data if m.id == "smollm2-135m-instruct")
    info = real_server.runtime.info  # type: ignore[attr-defined]
    if info.device == "cpu" and info.dtype == "bfloat16" and kernels_build():
        assert card.model_extra["model_impl"] == "native+q4_1+rowwise"
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    chat = await in_thread(client.chat.completions.create, model="smollm2-135m-instruct", messages=messages, max_tokens=20, temperature=0)
    assert "Paris" in chat.choices[0].message.content
    assert chat.choices[0].finish_reason in ("stop", "length")
    assert chat.usage.prompt_tokens > 20  # the template's default system prompt is counted

    def stream_chat() -> str:
        chunks = client.chat.completions.create(model="smollm2-135m-instruct", messages=messages, max_tokens=20, temperature=0, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    assert await in_thread(stream_chat) == chat.choices[0].message.content

    comp = await in_thread(client.completions.create, model="smollm2-135m-instruct", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert "Paris" in comp.choices[0].text

    def stream_completion() -> str:
        chunks = client.completions.create(model="smollm2-135m-instruct", prompt="The capital of France is", max_tokens=8, temperature=0, stream=True)
        return "".join(c.choices[0].text for c in chunks)

    assert await in_thread(stream_completion) == comp.choices[0].text
