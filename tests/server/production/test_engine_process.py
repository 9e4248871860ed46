"""The engine in its own process (`--engine-process`), through the `openai` SDK and the real
command: the split server answers as the one-process server does (text, logprobs, a grammar,
n > 1, streamed and not); a client that leaves is aborted across the hop and its blocks are
free in the engine; the engine process dying ends every open stream with a clean error within
a second and /health turns 503, then it is started again; it outlives a lull; a vision model's
images cross to it, and LoRA adapters (named at start, loaded and unloaded at run time); what
it cannot serve yet (adapters loaded at run time with several front ends) is refused at start in one line. (A
SIGKILL to the server leaving no engine process behind: test_api_servers.py.)
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio

from runtime.config import RuntimeConfig
from runtime.errors import ModelRefused
from tests.support.adapters import peft_greedy
from tests.support.servers import Server, start_server, tiny_config
from tests.support.tiny_vlm import VISION_CASES, case, reference_generate, run_all
from tests.support.waiting import in_thread, wait_until

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}


def answers(client: openai.OpenAI) -> list[Any]:
    """What a client sees of a few requests, in plain values."""
    out: list[Any] = []
    done = client.completions.create(model="tiny", prompt="The quick brown", max_tokens=16, temperature=0, logprobs=3)
    out.append((done.choices[0].text, done.choices[0].logprobs.token_logprobs, done.choices[0].logprobs.top_logprobs))
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=12, temperature=0, stream=True)
    out.append("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
    guided = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "a number"}], max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}},
    )  # fmt: skip
    out.append(json.loads(guided.choices[0].message.content))
    seeded = client.completions.create(model="tiny", prompt="Paged attention", max_tokens=10, n=2, seed=7, temperature=1.0)
    out.append(sorted(choice.text for choice in seeded.choices))
    return out


async def serve(nursery: trio.Nursery, model_dir: Path, **overrides: Any) -> tuple[Server, openai.OpenAI]:
    server = await start_server(nursery, tiny_config(model_dir, **overrides))
    return server, openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=60)


async def test_the_split_server_answers_as_the_one_process_server(tiny_model_dir: Path) -> None:
    seen = {}
    for split in (False, True):
        async with trio.open_nursery() as nursery:
            server, client = await serve(nursery, tiny_model_dir, engine_process=split)
            engine: Any = server.runtime
            assert (engine.link is not None) == split
            seen[split] = await in_thread(answers, client)
            client.close()
            server.stop.set()
    assert seen[True] == seen[False]


async def test_a_client_that_leaves_is_aborted_in_the_engine_process(tiny_model_dir: Path) -> None:
    async with trio.open_nursery() as nursery:
        server, client = await serve(nursery, tiny_model_dir, engine_process=True)
        engine: Any = server.runtime

        def leave_after_a_few_chunks() -> int:
            stream = client.completions.create(model="tiny", prompt="The quick", max_tokens=400, extra_body={"ignore_eos": True}, stream=True)
            for seen, _ in enumerate(stream, 1):
                if seen == 5:
                    stream.close()
                    return seen
            return -1

        assert await in_thread(leave_after_a_few_chunks) == 5
        # The abort crossed the socket: the engine's scheduler holds no request and no block.
        await wait_until(lambda: engine.statistics().get("running") == 0 and engine.statistics().get("kv_blocks_used") == 0, timeout=5)
        assert not engine.requests
        done = await in_thread(client.completions.create, model="tiny", prompt="again", max_tokens=4, temperature=0)
        assert done.choices[0].finish_reason in ("length", "stop")
        client.close()
        server.stop.set()


async def test_the_engine_process_dying_ends_every_stream_turns_health_503_and_restarts(tiny_model_dir: Path) -> None:
    async with trio.open_nursery() as nursery:
        server, client = await serve(nursery, tiny_model_dir, engine_process=True)
        engine: Any = server.runtime
        events: list[str] = []

        async def stream() -> None:
            body = {"model": "tiny", "prompt": "The quick", "max_tokens": 400, "ignore_eos": True, "stream": True}
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http, http.stream("POST", "/v1/completions", json=body) as resp:
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])

        async with trio.open_nursery() as streams:
            for _ in range(3):
                streams.start_soon(stream)
            await wait_until(lambda: len(events) >= 6, timeout=30)
            killed, killed_pid = time.monotonic(), engine.link.process.pid
            engine.link.process.send_signal(signal.SIGKILL)
        ended = time.monotonic() - killed
        assert ended < 1.0, ended  # every stream ended within a second
        errors = [json.loads(e) for e in events if e.startswith("{") and '"error"' in e]
        assert len(errors) == 3 and all(e["error"]["code"] for e in errors), events[-6:]
        assert events.count("[DONE]") == 0 or events[-1] == "[DONE]"
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
            health = await http.get("/health")
            refused = await http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert health.status_code == 503 and "engine" in health.text, health.text
        assert refused.status_code == 503, refused.text
        # Then the server starts it again, and serves.
        await wait_until(lambda: engine.accepting, timeout=60)
        done = await in_thread(client.completions.create, model="tiny", prompt="again", max_tokens=4, temperature=0)
        assert done.choices[0].finish_reason in ("length", "stop") and engine.link.process.pid != killed_pid
        client.close()
        server.stop.set()


async def test_the_engine_process_outlives_a_lull(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """trio spawns the child from a worker thread, which exits after trio's IDLE_TIMEOUT (10 s) of
    idleness: a child tied to that thread's life (Linux's PR_SET_PDEATHSIG) died 10 s into every
    lull. Here the idle timeout is 1 s, so the lull is short."""
    import trio._core._thread_cache as thread_cache

    monkeypatch.setattr(thread_cache, "IDLE_TIMEOUT", 1.0)
    async with trio.open_nursery() as nursery:
        server, client = await serve(nursery, tiny_model_dir, engine_process=True)
        engine: Any = server.runtime
        pid = engine.link.process.pid
        await trio.sleep(thread_cache.IDLE_TIMEOUT + 1.5)  # idle: the spawning thread is gone
        done = await in_thread(client.completions.create, model="tiny", prompt="still there", max_tokens=4, temperature=0)
        assert done.choices[0].finish_reason in ("length", "stop") and engine.link.process.pid == pid and engine.dead_reason is None
        client.close()
        server.stop.set()


async def test_a_vision_model_answers_from_an_engine_process_as_transformers_does(qwen2_vl_dir: Path) -> None:
    """Qwen2-VL's requests carry numpy arrays across the socket (pixel values, the image grid,
    M-RoPE positions): greedy tokens equal transformers' `generate`, one image, two, none."""
    cases = [VISION_CASES[0], VISION_CASES[1], VISION_CASES[3]]
    expected = [reference_generate(qwen2_vl_dir, *case(text, seeds)[::2], 8) for text, seeds in cases]
    got, _ = await run_all(qwen2_vl_dir, cases, 0.003, 8, engine_process=True)
    assert got == expected


async def test_adapters_are_served_and_loaded_in_an_engine_process(tiny_model_dir: Path, lora_adapters: dict[str, Path]) -> None:
    """A LoRA adapter named at start and one loaded at run time answer PEFT's own greedy text
    from the engine process; a bad path is the same 400 as in one process; unloading is a 404 after."""
    from transformers import AutoTokenizer

    tokenizer, prompt = AutoTokenizer.from_pretrained(tiny_model_dir), [5, 17, 23, 9, 41, 2, 60]
    expected = {name: tokenizer.decode(peft_greedy(tiny_model_dir, path, [prompt])[0][:8]) for name, path in lora_adapters.items()}
    root = next(iter(lora_adapters.values())).parent
    config = tiny_config(tiny_model_dir, engine_process=True, enable_lora=True, lora_dir=str(root), lora_modules={"fixed": str(root / "all-r8")}, spec_decoding="off")
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery, config)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:

            async def text(model: str) -> str:
                body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
                return str((await http.post("/v1/completions", json=body)).json()["choices"][0]["text"])

            assert await text("fixed") == expected["all-r8"]
            assert (await http.post("/v1/load_lora_adapter", json={"lora_name": "q", "lora_path": "qv-r4"})).status_code == 200
            assert await text("q") == expected["qv-r4"] and await text("fixed") == expected["all-r8"]
            bad = await http.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "nope"})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "lora_path", bad.text
            assert (await http.post("/v1/unload_lora_adapter", json={"lora_name": "q"})).status_code == 200
            gone = await http.post("/v1/completions", json={"model": "q", "prompt": prompt, "max_tokens": 2})
            assert gone.status_code == 404, gone.text
        server.stop.set()


def test_what_an_engine_process_cannot_serve_yet_is_refused_at_start(tiny_model_dir: Path) -> None:
    from actors.build import build_engine

    config = RuntimeConfig(model=str(tiny_model_dir), engine_process=True, api_servers=2, enable_lora=True, lora_dir=str(tiny_model_dir), port=0)
    with pytest.raises(ModelRefused, match="--api-servers and --lora-dir"):
        build_engine(config)
