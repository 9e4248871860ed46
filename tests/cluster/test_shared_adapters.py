"""LoRA adapters loaded while serve-ray serves (api/cluster/config_store.py `SharedAdapters`,
api/http/openai/lora.py `RunTimeAdapters.adopt`): a load through any ingress reaches every
replica before its answer, so the next requests for the adapter get PEFT's own text on both
replicas; an unload likewise leaves both answering 404."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.adapters import peft_greedy
from tests.support.cluster import REPLICA, Deployer

PROMPT = [5, 17, 23, 9, 41, 2, 60]


async def by_replica(http: httpx.AsyncClient, model: str, tries: int = 12) -> dict[str, set[str | int]]:
    """Each replica's answers to `model` (text, or the status when not 200); sessions spread them."""
    seen: dict[str, set[str | int]] = {}
    for i in range(tries):
        body = {"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        r = await http.post("/v1/completions", json=body, headers={"x-session-id": f"lora-{i}"})
        seen.setdefault(r.headers[REPLICA], set()).add(r.json()["choices"][0]["text"] if r.status_code == 200 else r.status_code)
    return seen


async def test_an_adapter_loaded_on_one_replica_serves_on_every_replica(deployer: Deployer, lora_adapters: dict[str, Path], tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(tiny_model_dir).decode(peft_greedy(tiny_model_dir, lora_adapters["qv-r4"], [PROMPT])[0][:6])
    root = lora_adapters["qv-r4"].parent
    cluster = deployer(model={"enable_lora": True, "lora_dir": str(root)})
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60) as http:
        r = await http.post("/v1/load_lora_adapter", json={"lora_name": "q", "lora_path": "qv-r4"})
        assert r.status_code == 200, r.text
        try:
            seen = await by_replica(http, "q")  # at once: the load answered once every replica had it
            assert len(seen) == 2 and all(answers == {expected} for answers in seen.values()), (seen, expected)
        finally:
            r = await http.post("/v1/unload_lora_adapter", json={"lora_name": "q"})
        assert r.status_code == 200, r.text
        seen = await by_replica(http, "q")
        assert len(seen) == 2 and set().union(*seen.values()) == {404}, seen
