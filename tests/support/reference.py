"""Helpers of the generation-control tests: the transformers reference and request shortcuts.

`Reference` is the served checkpoint loaded with transformers in float32: every behavioural
check (greedy continuations, logprobs, penalized argmax) is computed from its raw logits and
compared with what the server returned. Run its work with `in_thread`: the server shares the
test's trio loop and keeps serving meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import torch
import trio

from tests.conftest import Server

TOL = 1e-3  # float32 engine vs float32 transformers


@dataclass
class Reference:
    tokenizer: Any
    model: Any

    @property
    def eos(self) -> int:
        return int(self.tokenizer.eos_token_id)

    def encode(self, text: str) -> list[int]:
        """As the server encodes a completions prompt (this tokenizer adds no BOS)."""
        return list(self.tokenizer.encode(text, add_special_tokens=True))

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    @torch.inference_mode()
    def logits(self, ids: list[int]) -> torch.Tensor:
        """Raw next-token logits `[len(ids), V]`: row i scores the token after ids[i]."""
        return self.model(torch.tensor([ids])).logits[0].float()

    def logprobs(self, ids: list[int]) -> torch.Tensor:
        return torch.log_softmax(self.logits(ids), dim=-1)

    def greedy(
        self, ids: list[int], k: int, penalty: Callable[[torch.Tensor, list[int], int], torch.Tensor] | None = None
    ) -> list[int]:
        """k greedy tokens (EOS not special), optionally argmax of penalty(logits, history, n_prompt)."""
        seq = list(ids)
        for _ in range(k):
            row = self.logits(seq)[-1]
            if penalty is not None:
                row = penalty(row, seq, len(ids))
            seq.append(int(row.argmax()))
        return seq[len(ids) :]


async def in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await trio.to_thread.run_sync(partial(fn, *args, **kwargs))


async def complete(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    """POST /v1/completions, expecting 200; the parsed body."""
    r = await http.post("/v1/completions", json={"model": "tiny", **body})
    assert r.status_code == 200, r.text
    return r.json()


async def chat(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    r = await http.post("/v1/chat/completions", json={"model": "tiny", **body})
    assert r.status_code == 200, r.text
    return r.json()


async def stream_events(http: httpx.AsyncClient, path: str, **body: Any) -> list[dict[str, Any]]:
    """An SSE response's JSON payloads (the trailing [DONE] checked and dropped)."""
    async with http.stream("POST", path, json={"model": "tiny", "stream": True, **body}) as resp:
        assert resp.status_code == 200, (await resp.aread()).decode()
        raw = (await resp.aread()).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert events[-1] == "data: [DONE]", events[-3:]
    return [json.loads(e[len("data: ") :]) for e in events[:-1]]


async def wait_idle(server: Server, timeout: float = 5.0) -> dict[str, Any]:
    """Statistics once nothing is live (finished requests leave the scheduler a step later)."""
    with trio.fail_after(timeout):
        while True:
            stats = server.runtime.statistics()  # type: ignore[attr-defined]
            if stats["live_requests"] == 0 and stats["requests"] == 0 and stats["running"] == 0 and stats["waiting"] == 0:
                return stats
            await trio.sleep(0.01)
