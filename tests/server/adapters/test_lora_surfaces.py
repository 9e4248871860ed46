"""LoRA adapters through the `openai` SDK (runtime/registry.py AdapterView, runtime/adapters.py):
each adapter is listed in /v1/models with its base as `parent` and chosen by `model` on
Completions (whole and streamed: PEFT's own greedy text), Chat, Responses, Azure's deployment
header, a Databricks serving endpoint of the adapter's name and one created with a traffic
split over two adapters and the base (each request answered by the entity it was routed to),
beside the base, its requests and tokens counted in /metrics under its name; an adapter not
served is a 404 naming it."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
import trio

from tests.support.adapters import ADAPTERS, peft_greedy
from tests.support.servers import start_server, tiny_config
from tests.support.waiting import in_thread

PROMPT = [5, 17, 23, 9, 41, 2, 60]


async def test_adapters_are_listed_and_chosen_by_model_on_every_surface(
    tiny_model_dir: Path, lora_adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    expected = {name: tokenizer.decode(peft_greedy(tiny_model_dir, lora_adapters[name], [PROMPT])[0][:8]) for name in ADAPTERS}
    monkeypatch.setenv("SWITCHYARD_STATE_DIR", str(tmp_path))  # the Databricks endpoints' store
    config = tiny_config(tiny_model_dir, enable_lora=True, lora_modules={n: str(p) for n, p in lora_adapters.items()}, spec_decoding="off")
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery, config)
        with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=60) as client:
            cards = {m.id: m for m in (await in_thread(client.models.list)).data}
            assert set(cards) == {"tiny", *ADAPTERS} and all(cards[n].model_extra["parent"] == "tiny" for n in ADAPTERS)
            assert "parent" not in (cards["tiny"].model_extra or {})
            for name in ADAPTERS:
                body = dict(model=name, prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
                whole = await in_thread(client.completions.create, **body)
                assert whole.model == name and whole.choices[0].text == expected[name]

                def streamed(body: dict = body) -> str:
                    return "".join(c.choices[0].text for c in client.completions.create(stream=True, **body) if c.choices)

                assert await in_thread(streamed) == expected[name]
                chat = await in_thread(client.chat.completions.create, model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=6)
                assert chat.model == name and chat.choices[0].message.content is not None
                response = await in_thread(client.responses.create, model=name, input="hi", max_output_tokens=6)
                assert response.model == name and response.status in ("completed", "incomplete")
            base = await in_thread(client.completions.create, model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
            assert base.choices[0].text not in expected.values()
            with pytest.raises(openai.NotFoundError, match="nope"):
                await in_thread(client.completions.create, model="nope", prompt=PROMPT, max_tokens=2)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            azure = await http.post("/chat/completions?api-version=2024-05-01-preview", json=chat, headers={"azureml-model-deployment": "qv-r4"})
            assert azure.status_code == 200 and azure.json()["model"] == "qv-r4", azure.text
            databricks = await http.post("/serving-endpoints/all-r8/invocations", json=chat)
            assert databricks.status_code == 200 and databricks.json()["model"] == "all-r8", databricks.text
            await _traffic_split(http)
            metrics = (await http.get("/metrics")).text  # each adapter's requests and tokens under its name
            assert all(f'switchyard_generation_tokens_total{{model="{n}"}}' in metrics for n in ["tiny", *ADAPTERS]), metrics[:2000]
        server.stop.set()


async def _traffic_split(http: httpx.AsyncClient) -> None:
    """A serving endpoint split 40/30/30 over two adapters and the base: every request is
    answered by the entity it was routed to (its greedy chat answer), each entity drawn."""
    routes = {"tuned-a": ("qv-r4", 40), "tuned-b": ("all-r8", 30), "plain": ("tiny", 30)}
    config = {
        "served_entities": [{"name": n, "entity_name": entity} for n, (entity, _) in routes.items()],
        "traffic_config": {"routes": [{"served_model_name": n, "traffic_percentage": pct} for n, (_, pct) in routes.items()]},
    }
    assert (await http.post("/api/2.0/serving-endpoints", json={"name": "split", "config": config})).status_code == 200
    chat = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 6, "temperature": 0}
    own = {
        n: (await http.post("/v1/chat/completions", json={**chat, "model": entity})).json()["choices"][0]["message"]["content"]
        for n, (entity, _) in routes.items()
    }
    assert len(set(own.values())) == 3, own  # three different answers: a misrouted request shows
    drawn: dict[str, int] = {}
    for _ in range(30):
        r = await http.post("/serving-endpoints/split/invocations", json=chat)
        served = r.headers["served-model-name"]
        assert r.json()["model"] == routes[served][0] and r.json()["choices"][0]["message"]["content"] == own[served], (served, r.text)
        drawn[served] = drawn.get(served, 0) + 1
    assert set(drawn) == set(routes), drawn
