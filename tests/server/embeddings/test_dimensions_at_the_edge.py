"""Embeddings `dimensions` is checked before the model runs (a check after the forward pass
let a request that could never succeed take a device step). The embedding runner reports its vector length when it loads (ModelInfo.embedding_size)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.support.servers import Server
from tests.support.waiting import in_thread

MODEL = "all-minilm-l6-v2"


def count_steps(runner: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    steps: list[int] = []
    execute = runner.execute

    def counted(plan: Any) -> Any:
        steps.append(len(plan.seqs))
        return execute(plan)

    monkeypatch.setattr(runner, "execute", counted)
    return steps


async def test_wrong_dimensions_refused_before_the_model_runs(server: Server, client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
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
