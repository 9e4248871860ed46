"""Embeddings through the real pipeline (tokenizer → scheduler → executor actors) with the
embedded all-MiniLM-L6-v2, driven by the official openai client."""

from __future__ import annotations

import openai
import pytest
import torch
import trio
from transformers import AutoModel, AutoTokenizer

from runtime.config import RuntimeConfig
from runtime.model_store import resolve_model
from tests.support.servers import Server, start_server
from tests.support.waiting import in_thread

TEXTS = [
    "The cat sits on the mat.",
    "A feline rests on a rug.",
    "Stock markets fell sharply on Monday.",
    "Ünïcödé and emoji 😀 survive tokenization.",
    "short",
]


def reference(texts: list[str]) -> torch.Tensor:
    """A direct transformers forward with sentence-transformers' recipe: mean pool, normalize."""
    path = resolve_model(None, task="embeddings")[1]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    batch = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1)


async def test_embeddings_equal_direct_forward_in_order(client: openai.OpenAI) -> None:
    expected = reference(TEXTS)
    # The SDK asks for base64 by default and decodes it: both encodings are exercised.
    batched = await in_thread(client.embeddings.create, model="all-minilm-l6-v2", input=TEXTS)
    floats = await in_thread(client.embeddings.create, model="all-minilm-l6-v2", input=TEXTS, encoding_format="float")
    assert [d.index for d in batched.data] == list(range(len(TEXTS)))
    for resp in (batched, floats):
        got = torch.tensor([d.embedding for d in resp.data])
        cosine = torch.nn.functional.cosine_similarity(got, expected, dim=-1)
        assert torch.all(cosine > 1 - 1e-5), cosine
    for i, text in enumerate(TEXTS):
        one = await in_thread(client.embeddings.create, model="all-minilm-l6-v2", input=text)
        cosine = torch.nn.functional.cosine_similarity(torch.tensor(one.data[0].embedding), expected[i], dim=0)
        assert cosine > 1 - 1e-5
    assert batched.usage.prompt_tokens > len(TEXTS)
    # Meaning survives: the paraphrase is closer than the unrelated sentence.
    assert expected[0] @ expected[1] > expected[0] @ expected[2]


async def test_embeddings_errors_and_routing(client: openai.OpenAI, server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await in_thread(client.embeddings.create, model="all-minilm-l6-v2", input="x", dimensions=8)
    assert info.value.body["param"] == "dimensions"
    with pytest.raises(openai.BadRequestError) as info:
        await in_thread(client.embeddings.create, model="all-minilm-l6-v2", input=[])
    assert info.value.body["param"] == "input"
    # A chat model is not an embedding model, and the other way round.
    with pytest.raises(openai.NotFoundError):
        await in_thread(client.embeddings.create, model="tiny", input="x")
    with pytest.raises(openai.NotFoundError):
        await in_thread(client.chat.completions.create, model="all-minilm-l6-v2", messages=[{"role": "user", "content": "x"}])


async def test_instruction_is_prepended(server: Server) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=server.base_url) as http:
        body = {"model": "all-minilm-l6-v2", "input": ["where is the cat"], "instruction": "Represent this sentence for searching relevant passages:"}
        with_instruction = (await http.post("/v1/embeddings", json=body)).json()
        plain = (await http.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": [f"{body['instruction']} where is the cat"]})).json()
    a = torch.tensor(with_instruction["data"][0]["embedding"])
    b = torch.tensor(plain["data"][0]["embedding"])
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 1 - 1e-6


async def test_a_local_sentence_transformers_directory_is_served_like_minilm(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Any local encoder in the sentence-transformers layout (here tests/support/tiny_bert.py,
    what the fuzz test serves) pools as its modules.json says: equal to a direct forward."""
    import httpx

    from tests.support.tiny_bert import build_tiny_bert

    model_dir = build_tiny_bert(tmp_path / "tiny-bert")
    monkeypatch.setenv("SWITCHYARD_STATE_DIR", str(tmp_path))
    config = RuntimeConfig(model=str(model_dir), served_name="tiny-embed", task="embeddings", dtype="float32", num_threads=1, port=0)
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, config)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as http:
            r = await http.post("/v1/embeddings", json={"input": TEXTS[:3]})
            assert r.status_code == 200, r.text
            got = torch.tensor([d["embedding"] for d in r.json()["data"]])
        srv.stop.set()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = tok(TEXTS[:3], padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    expected = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    assert got.shape == (3, 32)
    assert torch.all(torch.nn.functional.cosine_similarity(got, expected, dim=-1) > 1 - 1e-5)
