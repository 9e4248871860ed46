"""Waiting in tests: blocking calls off the trio loop, conditions, and an engine gone idle.

The server under test shares the test's trio loop, so a synchronous client (the openai SDK, a
transformers forward) runs through `in_thread` and the server keeps serving meanwhile.
`wait_idle` is the "nothing leaked" check scenarios end with: no live request, no scheduler
queue, no KV block in use, no message sitting in any actor's inbox.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import trio


async def in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await trio.to_thread.run_sync(partial(fn, *args, **kwargs))


async def wait_until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    """Poll `condition` until it holds; fail (trio.TooSlowError) after `timeout` s."""
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.002)


def leaks(runtime: Any) -> dict[str, int]:
    """Everything that must be zero once no request is in flight (empty dict: nothing leaked)."""
    stats = runtime.statistics()
    counts = {
        "live_requests": stats["live_requests"],
        "scheduler_requests": stats["requests"],
        "waiting": stats["waiting"],
        "running": stats["running"],
        "kv_blocks_used": stats["kv_blocks_used"],
        "scheduler_inbox": stats["inbox"],
        "tokenizer_inbox": runtime.tokenizer_actor.inbox.statistics().current_buffer_used,
        "detokenizer_inbox": runtime.detokenizer.inbox.statistics().current_buffer_used,
        "detokenizer_states": len(runtime.detokenizer.requests),
        # the engine process's own channels are its business: its counters above say what it holds
        "executor_inbox": runtime.executor.plans.statistics().current_buffer_used if getattr(runtime, "link", None) is None else 0,
        "pending_tokens": runtime.pending_tokens(),
        "requests_dict": len(runtime.requests),
    }
    return {k: v for k, v in counts.items() if v}


async def wait_idle(runtime: Any, timeout: float = 10.0) -> None:
    """Wait (bounded) until nothing is in flight; fail naming what is left."""
    with trio.move_on_after(timeout):
        while leaks(runtime):
            await trio.sleep(0.02)
    assert not leaks(runtime), f"left over after {timeout}s: {leaks(runtime)}"


async def settled_statistics(runtime: Any, timeout: float = 5.0) -> dict[str, Any]:
    """The engine's statistics once no request is live or queued (finished requests leave the
    scheduler a step later); fails (trio.TooSlowError) after `timeout` s."""
    with trio.fail_after(timeout):
        while True:
            stats = runtime.statistics()
            if stats["live_requests"] == 0 and stats["requests"] == 0 and stats["running"] == 0 and stats["waiting"] == 0:
                return stats
            await trio.sleep(0.01)
