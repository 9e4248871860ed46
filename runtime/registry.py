"""`ModelRegistry`: every model this server serves, by served name.

Owns: resolving a request's `model` field to a Runtime (a 404 naming `model` when unknown,
the first model of the right task when absent; a LoRA adapter's name to its `AdapterView`), starting all runtimes in one nursery, and
draining/stopping them together. Routes reach runtimes only through it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import msgspec
import trio

from runtime.errors import ModelNotFound
from runtime.protocol import Runtime
from runtime.request import Prompt
from runtime.sampling import SamplingParams


class AdapterView:
    """A LoRA adapter (runtime/adapters.py) served by its base model's engine: that runtime in
    every respect but its name and the adapter each of its requests carries
    (`SamplingParams.adapter`, which the prefix cache and the runner's rows key on)."""

    def __init__(self, base: Runtime, name: str) -> None:
        self.base = base
        self.served_name = name
        self.parent = base.served_name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.base, attr)

    def _tagged(self, sampling: SamplingParams) -> SamplingParams:
        return msgspec.structs.replace(sampling, adapter=self.served_name)

    def open(self, prompt: Prompt, sampling: SamplingParams) -> Any:
        return self.base.open(prompt, self._tagged(sampling))

    def open_many(self, prompt: Prompt, sampling: SamplingParams, n: int, group: Any = None) -> Any:
        return self.base.open_many(prompt, self._tagged(sampling), n, group)

    def submit(self, prompt: Prompt, sampling: SamplingParams) -> Any:
        return self.base.submit(prompt, self._tagged(sampling))


class ModelRegistry:
    def __init__(self, runtimes: Iterable[Runtime]) -> None:
        self._by_name: dict[str, Runtime] = {}
        self._adapters: dict[str, Runtime] = {}
        for runtime in runtimes:
            config = getattr(runtime, "config", None)
            names = [runtime.served_name, *(config.lora_modules if config is not None and config.enable_lora else ())]
            for name in names:
                if name in self._by_name or name in self._adapters:
                    raise ValueError(f"two models are served as {name!r}")
            self._by_name[runtime.served_name] = runtime
            for name in names[1:]:
                self._adapters[name] = AdapterView(runtime, name)

    def lora_base(self) -> Runtime | None:
        """The model adapters load onto at run time: the first started with --enable-lora."""
        return next((r for r in self._by_name.values() if getattr(getattr(r, "config", None), "enable_lora", False)), None)

    def add_adapter(self, base: Runtime, name: str) -> None:
        if name in self._by_name or name in self._adapters:
            raise ValueError(f"{name!r} is served already")
        self._adapters[name] = AdapterView(base, name)

    def remove_adapter(self, name: str) -> Runtime:
        """Take the adapter's name away (KeyError if none); its base model."""
        view = self._adapters.pop(name)
        assert isinstance(view, AdapterView)
        return view.base

    def served(self) -> Iterator[Runtime]:
        """Every name a request may send: each model, then its adapters."""
        yield from self._by_name.values()
        yield from self._adapters.values()

    def __iter__(self) -> Iterator[Runtime]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def resolve(self, model: str | None, task: str = "generate") -> Runtime:
        if model:
            runtime = self._by_name.get(model) or self._adapters.get(model)
            if runtime is None or runtime.task != task:
                raise ModelNotFound(model)
            return runtime
        for runtime in self._by_name.values():
            if runtime.task == task:
                return runtime
        raise ModelNotFound(f"(none given; this server has no {task} model)")

    async def run(self, task_status: trio.TaskStatus[ModelRegistry] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for runtime in self._by_name.values():
                await nursery.start(runtime.run)
            task_status.started(self)

    async def drain(self, timeout: float) -> int:
        """Drain every runtime at once (`Runtime.drain`); how many requests were aborted."""
        aborted: list[int] = []

        async def one(runtime: Runtime) -> None:
            aborted.append(await runtime.drain(timeout))

        async with trio.open_nursery() as nursery:
            for runtime in self._by_name.values():
                nursery.start_soon(one, runtime)
        return sum(aborted)

    def stop(self) -> None:
        for runtime in self._by_name.values():
            runtime.stop()

    def health(self) -> tuple[bool, str | None]:
        for runtime in self._by_name.values():
            ok, reason = runtime.health()
            if not ok:
                return False, f"{runtime.served_name}: {reason}"
        return True, None
