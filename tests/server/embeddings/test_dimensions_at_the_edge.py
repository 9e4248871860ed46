"""Embeddings `dimensions` is checked before the model runs (issue 11, left undone before: the
check came after the forward pass, so a request that could never succeed still took a device
step). The embedding runner reports its vector length when it loads (ModelInfo.embedding_size)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.conftest import Server
from tests.embeddings.test_embeddings import in_thread, server  # noqa: F401  (the fixture)

MODEL = "all-minilm-l6-v2"


@pytest.fixture
def client(server: Server) -> Iterator[openai.OpenAI]:  # noqa: F811
    with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def count_steps(runner: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    steps: list[int] = []
    execute = runner.execute

    def counted(plan: Any) -> Any:
        steps.append(len(plan.seqs))
        return execute(plan)

    monkeypatch.setattr(runner, "execute", counted)
    return steps


async def test_wrong_dimensions_refused_before_the_model_runs(server: Server, client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    embedder = server.runtimes[1]
    steps = count_steps(embedder.runner, monkeypatch)  # type: ignore[attr-defined]
    for dimensions in (8, 383, 385):
        with pytest.raises(openai.BadRequestError) as info:
            await in_thread(client.embeddings.create, model=MODEL, input=["one", "two"], dimensions=dimensions)
        assert info.value.body["param"] == "dimensions" and "384" in info.value.body["message"]  # type: ignore[index]
    assert steps == []  # no device step ran for a request that could not succeed
    out = await in_thread(client.embeddings.create, model=MODEL, input=["one", "two"], dimensions=384)
    assert [len(d.embedding) for d in out.data] == [384, 384] and steps
    assert embedder.info.embedding_size == 384  # type: ignore[attr-defined]
