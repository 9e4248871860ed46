"""Calls that wait for replies matched by number (runtime/replies.py): answers out of order reach
their own callers, an answer to no one is dropped, and a caller whose other end is gone is told."""

from __future__ import annotations

import pytest
import trio

from runtime.replies import Gone, Replies


async def test_answers_reach_their_own_calls_and_a_gone_end_fails_the_rest() -> None:
    replies, numbers, got = Replies(), dict[str, int](), dict[str, object]()

    async def call(name: str) -> None:
        try:
            got[name] = await replies.ask(lambda number: numbers.__setitem__(name, number))
        except Gone:
            got[name] = "gone"

    async with trio.open_nursery() as nursery:
        for name in "abc":
            nursery.start_soon(call, name)
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(numbers.values()) == [0, 1, 2]
        replies.answer(numbers["b"], "for b")
        replies.answer(numbers["a"], "for a")
        replies.answer(99, "for no one")
        await trio.testing.wait_all_tasks_blocked()
        replies.fail_all()
    assert got == {"a": "for a", "b": "for b", "c": "gone"}


async def test_a_send_that_raises_leaves_nothing_waiting() -> None:
    replies = Replies()

    async def broken(number: int) -> None:
        raise trio.BrokenResourceError

    with pytest.raises(trio.BrokenResourceError):
        await replies.ask(broken)
    assert not replies._waiting
