"""LoRA adapters loaded and unloaded while the server runs (vLLM's /v1/load_lora_adapter and
/v1/unload_lora_adapter; the routes are api/http/openai/lora.py, which name it in the registry).

Owns `AdapterMethods`, the engine's `load_adapter` and `unload_adapter`, and the two changes
they make where the runner lives (`load_into`, `forget_in`: in the server's process, or in the
engine process, asked over its socket: actors/engine_link.py). Loading checks the adapter as
the command line does (runtime/adapters.py), reads and fits its weights to the base on a
worker thread, then registers them on the device thread, between two steps (its first step
fills a slot: native/lora.py); the route names it only after that. Unloading comes after the
route took the name away (new requests: 404): the requests still running with it end with a
404 naming it, then it is forgotten on the device thread, behind every step already sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from runtime.adapters import read_adapter
from runtime.errors import ModelNotFound
from runtime.messages import AbortReason


async def load_into(runner: Any, thread: Any, name: str, path: str, max_rank: int) -> None:
    """Load the PEFT adapter at `path` as `name` into `runner`; ValueError in one line when it cannot be."""
    adapters = runner.adapters()
    if name in adapters.registered:
        raise ValueError(f"an adapter named {name!r} is loaded already")
    config = read_adapter(name, path, max_rank)
    layers = await trio.to_thread.run_sync(adapters.read, config)
    await thread.run(adapters.register, config, layers)


async def forget_in(runner: Any, thread: Any, name: str) -> None:
    """Free `name`'s slot in `runner`; KeyError if it is not loaded."""
    adapters = runner.adapters()
    if name not in adapters.registered:
        raise KeyError(name)
    await thread.run(adapters.forget, name)


class AdapterMethods:
    """Mixed into actors/engine.py's Engine (its runner, executor, link, requests and config)."""

    runner: Any
    executor: Any
    link: Any  # the engine process's link (--engine-process), or None
    requests: dict[str, Any]
    config: Any
    abort: Callable[[str, AbortReason], None]

    async def load_adapter(self, name: str, path: str) -> None:
        """Load the PEFT adapter at `path` as `name`; ValueError in one line when it cannot be."""
        if self.link is not None:
            await self.link.adapter(name, path)
        else:
            await load_into(self.runner, self.executor.thread, name, path, self.config.max_lora_rank)

    async def unload_adapter(self, name: str) -> None:
        """End `name`'s running requests (a 404 naming it) and free its slot; KeyError if not loaded."""
        for request_id, ctx in list(self.requests.items()):
            if ctx.sampling.adapter == name:
                self.abort(request_id, AbortReason.FAILED)
                ctx.mailbox.fail(ModelNotFound(name))
        if self.link is not None:
            await self.link.adapter(name, None)
        else:
            await forget_in(self.runner, self.executor.thread, name)
