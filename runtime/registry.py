"""`ModelRegistry`: every model this server serves, by served name.

Owns: resolving a request's `model` field to a Runtime (a 404 naming `model` when unknown,
the first model of the right task when absent), starting all runtimes in one nursery, and
draining/stopping them together. Routes reach runtimes only through it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import trio

from runtime.errors import ModelNotFound
from runtime.protocol import Runtime


class ModelRegistry:
    def __init__(self, runtimes: Iterable[Runtime]) -> None:
        self._by_name: dict[str, Runtime] = {}
        for runtime in runtimes:
            if runtime.served_name in self._by_name:
                raise ValueError(f"two models are served as {runtime.served_name!r}")
            self._by_name[runtime.served_name] = runtime

    def __iter__(self) -> Iterator[Runtime]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def resolve(self, model: str | None, task: str = "generate") -> Runtime:
        if model:
            runtime = self._by_name.get(model)
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
