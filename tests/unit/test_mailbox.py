"""DeltaMailbox: non-blocking put that merges, get that drains, finish and fail."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from runtime.mailbox import DeltaMailbox, GroupSignal
from runtime.messages import FinishReason, Logprob, TextDelta, Usage


async def test_puts_merge_until_taken() -> None:
    box = DeltaMailbox()
    first = TextDelta(text="Hel", token_ids=[1, 2])
    box.put(first)
    box.put(TextDelta(text="lo", token_ids=[3]))
    box.put(TextDelta(text="", token_ids=[]))
    got = await box.get()
    assert (got.text, got.token_ids, got.finish_reason) == ("Hello", [1, 2, 3], None)
    assert (first.text, first.token_ids) == ("Hel", [1, 2])  # the producer's delta is not mutated
    box.put(TextDelta(text=" world", token_ids=[4]))
    got = await box.get()
    assert (got.text, got.token_ids) == (" world", [4])
    assert not box.finished


async def test_finish_delivers_everything_then_none() -> None:
    box = DeltaMailbox()
    usage = Usage(prompt_tokens=3, completion_tokens=2)
    box.put(TextDelta(text="a", token_ids=[1]))
    box.put(TextDelta(text="b", token_ids=[2], finish_reason=FinishReason.STOP, stop_reason="END", usage=usage))
    assert box.finished
    box.put(TextDelta(text="late", token_ids=[9]))  # after the final delta: dropped
    box.fail(RuntimeError("late"))  # likewise
    got = await box.get()
    assert (got.text, got.token_ids, got.finish_reason, got.stop_reason, got.usage) == (
        "ab",
        [1, 2],
        FinishReason.STOP,
        "END",
        usage,
    )
    with trio.fail_after(1):
        assert await box.get() is None
        assert await box.get() is None


async def test_get_waits_for_a_put() -> None:
    box = DeltaMailbox()
    results = []

    async def reader() -> None:
        results.append(await box.get())

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert results == []
            box.put(TextDelta(text="x", token_ids=[7]))
    assert [(r.text, r.token_ids) for r in results] == [("x", [7])]


async def test_get_waits_for_the_final_delta_after_draining() -> None:
    box = DeltaMailbox()
    box.put(TextDelta(text="x", token_ids=[1]))
    assert (await box.get()).text == "x"
    results = []

    async def reader() -> None:
        results.append(await box.get())
        results.append(await box.get())

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert results == []
            box.put(TextDelta(finish_reason=FinishReason.LENGTH))
    assert results[0].finish_reason is FinishReason.LENGTH and results[0].text == ""
    assert results[1] is None


async def test_fail_raises_after_pending_text() -> None:
    box = DeltaMailbox()
    box.put(TextDelta(text="partial", token_ids=[1]))
    box.fail(ValueError("engine died"))
    assert box.finished
    got = await box.get()
    assert got.text == "partial"
    with pytest.raises(ValueError, match="engine died"):
        await box.get()
    with pytest.raises(ValueError):
        await box.get()
    box.put(TextDelta(text="ignored"))
    with pytest.raises(ValueError):
        await box.get()


async def test_fail_wakes_a_waiting_reader() -> None:
    box = DeltaMailbox()
    caught = []

    async def reader() -> None:
        try:
            await box.get()
        except KeyError as exc:
            caught.append(exc)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            box.fail(KeyError("gone"))
    assert len(caught) == 1


async def test_logprobs_merge() -> None:
    box = DeltaMailbox()
    a, b, c = Logprob(1, -0.1), Logprob(2, -0.2), Logprob(3, -0.3)
    prompt = [Logprob(9, -1.0)]
    first_logprobs = [a]
    box.put(TextDelta(text="x", token_ids=[1], logprobs=first_logprobs, prompt_logprobs=prompt))
    box.put(TextDelta(text="y", token_ids=[2], logprobs=[b]))
    box.put(TextDelta(text="", token_ids=[]))  # no logprobs: keeps what was merged
    box.put(TextDelta(text="z", token_ids=[3], logprobs=[c], finish_reason=FinishReason.STOP))
    got = await box.get()
    assert got.logprobs == [a, b, c]
    assert got.prompt_logprobs == prompt
    assert first_logprobs == [a]  # not extended in place


def test_take_nowait() -> None:
    box = DeltaMailbox()
    assert box.take_nowait() == (False, None)
    box.put(TextDelta(text="a", token_ids=[1]))
    ready, delta = box.take_nowait()
    assert ready and delta.text == "a"
    assert box.take_nowait() == (False, None)
    box.put(TextDelta(text="b", finish_reason=FinishReason.STOP))
    ready, delta = box.take_nowait()
    assert ready and delta.finish_reason is FinishReason.STOP
    assert box.take_nowait() == (True, None)


async def test_group_signal_wakes_on_any_member() -> None:
    group = GroupSignal()
    boxes = [DeltaMailbox(), DeltaMailbox()]
    for box in boxes:
        box.group = group
    woke = []

    async def waiter() -> None:
        await group.wait()
        woke.append(True)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert woke == []
            boxes[1].put(TextDelta(text="x"))
    assert woke == [True]
    assert boxes[0].take_nowait() == (False, None)
    assert boxes[1].take_nowait()[1].text == "x"


async def test_a_stream_interval_sends_the_first_token_at_once_then_every_n_and_the_last() -> None:
    box = DeltaMailbox(min_tokens=3)
    woken = []

    async def reader() -> None:
        while (delta := await box.get()) is not None:
            woken.append(delta.token_ids)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            box.put(TextDelta(text="", token_ids=[]))  # no tokens (prompt logprobs, say): at once, and not the first token
            await trio.testing.wait_all_tasks_blocked()
            for token in range(1, 8):
                box.put(TextDelta(text=str(token), token_ids=[token]))
                await trio.testing.wait_all_tasks_blocked()
            assert woken == [[], [1], [2, 3, 4], [5, 6, 7]]
            box.put(TextDelta(text="8", token_ids=[8]))
            await trio.testing.wait_all_tasks_blocked()
            assert woken[-1] == [5, 6, 7]  # one token pending: held
            box.put(TextDelta(text="9", token_ids=[9], finish_reason=FinishReason.LENGTH))
    assert woken[-1] == [8, 9]  # the last delta goes whatever its size


async def test_a_held_delta_goes_before_an_error_and_to_a_group_reader_only_when_due() -> None:
    box = DeltaMailbox(min_tokens=4)
    box.group = GroupSignal()
    box.put(TextDelta(text="a", token_ids=[1]))
    assert box.take_nowait()[1].token_ids == [1]
    box.put(TextDelta(text="b", token_ids=[2]))
    assert box.take_nowait() == (False, None)  # held: the group's reader waits on
    box.fail(RuntimeError("engine failed"))
    assert box.take_nowait()[1].token_ids == [2]  # what was held is not lost
    with pytest.raises(RuntimeError):
        box.take_nowait()
