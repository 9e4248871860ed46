"""The tokenizer actor's guide compilation and the Responses API's message truncation.

Compilation: a request whose grammar is not compiled yet must not hold up the requests behind
it (those that need no compilation keep their order), several compilations run at once, and
two requests with the same new grammar compile it once. Truncation (`truncation: "auto"`):
`fit_messages` drops the oldest messages, never the system message or the last one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import trio

from actors.guidance import GuideCompiler
from actors.scheduler import SchedulerInbox
from actors.tokenizer import TokenizerActor, encode_prompt, fit_messages
from runtime.errors import InvalidRequest
from runtime.request import Prompt, RequestContext
from runtime.sampling import Guide, SamplingParams
from tests.support.waiting import wait_until


class SlowCompiler:
    """A GuideCompiler stand-in whose compilations wait until the test releases them."""

    def __init__(self, compiled: tuple[str, ...] = ()) -> None:
        self.compiled = set(compiled)
        self.release: dict[str, threading.Event] = {}
        self.lock = threading.Lock()
        self.running = 0
        self.most_running = 0

    def warm(self) -> None:
        pass

    def cached(self, guide: Guide) -> str | None:
        return f"matcher:{guide.definition}" if guide.definition in self.compiled else None

    def matcher(self, guide: Guide) -> str:
        with self.lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            if guide.definition == "bad":
                raise InvalidRequest("Invalid lark: nope", param="tools")
            assert self.release.setdefault(guide.definition, threading.Event()).wait(10)
            self.compiled.add(guide.definition)
            return f"matcher:{guide.definition}"
        finally:
            with self.lock:
                self.running -= 1


def request(rid: str, guide: str | None = None) -> RequestContext:
    sampling = SamplingParams(max_tokens=4, guide=Guide(kind="lark", definition=guide, param="tools") if guide else None)
    return RequestContext(request_id=rid, prompt=Prompt(text=f"hello {rid}"), sampling=sampling, arrival_time=0.0)


async def run_actor(nursery: trio.Nursery, tokenizer: Any, compiler: Any) -> tuple[trio.MemorySendChannel[Any], trio.MemoryReceiveChannel[Any]]:
    inbox_send, inbox_recv = trio.open_memory_channel[Any](64)
    sched_send, sched_recv = trio.open_memory_channel[Any](64)
    aborts_send, _ = trio.open_memory_channel[Any](64)
    actor = TokenizerActor(tokenizer, 512, inbox_recv, SchedulerInbox(sched_send, aborts_send), compiler, compile_concurrency=2)
    await nursery.start(actor.run)
    return inbox_send, sched_recv


async def receive(channel: trio.MemoryReceiveChannel[Any], n: int) -> list[Any]:
    with trio.fail_after(10):
        return [await channel.receive() for _ in range(n)]


async def test_a_slow_compile_does_not_hold_up_the_requests_behind_it(tokenizer: Any) -> None:
    compiler = SlowCompiler(compiled=("cached",))
    async with trio.open_nursery() as nursery:
        inbox, scheduled = await run_actor(nursery, tokenizer, compiler)
        for ctx in (request("slow", "new grammar"), request("b"), request("c", "cached"), request("d")):
            await inbox.send(ctx)
        ahead = await receive(scheduled, 3)
        assert [r.request_id for r in ahead] == ["b", "c", "d"]  # in their order, without waiting
        assert [r.matcher for r in ahead] == [None, "matcher:cached", None]
        compiler.release.setdefault("new grammar", threading.Event()).set()
        [slow] = await receive(scheduled, 1)
        assert slow.request_id == "slow" and slow.matcher == "matcher:new grammar"
        await inbox.aclose()


async def test_compilations_run_side_by_side_and_failures_fail_their_request(tokenizer: Any) -> None:
    compiler = SlowCompiler()
    async with trio.open_nursery() as nursery:
        inbox, scheduled = await run_actor(nursery, tokenizer, compiler)
        bad = request("bad", "bad")
        aborted = request("aborted", "g3")
        for ctx in (request("one", "g1"), request("two", "g2"), bad, aborted, request("plain")):
            await inbox.send(ctx)
        [plain] = await receive(scheduled, 1)
        assert plain.request_id == "plain"
        await wait_until(lambda: compiler.running == 2)  # two at once (the limit), both blocked
        aborted.aborted = True
        for name in ("g1", "g2", "g3"):
            compiler.release.setdefault(name, threading.Event()).set()
        done = await receive(scheduled, 2)
        assert sorted(r.request_id for r in done) == ["one", "two"] and compiler.most_running == 2
        await wait_until(lambda: bad.mailbox.finished)
        with pytest.raises(InvalidRequest):
            bad.mailbox.take_nowait()
        await inbox.aclose()  # the actor ends once pending compilations are through
    assert scheduled.statistics().current_buffer_used == 0  # the aborted request never went on


def test_one_compilation_per_new_grammar(tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import actors.guidance

    compiler = GuideCompiler(tokenizer, len(tokenizer))
    compiler.warm()
    calls: list[Guide] = []
    real = actors.guidance.guide_grammar

    def slow_grammar(guide: Guide) -> str:
        calls.append(guide)
        time.sleep(0.2)
        return real(guide)

    monkeypatch.setattr(actors.guidance, "guide_grammar", slow_grammar)
    guide = Guide(kind="json_object")
    assert compiler.cached(guide) is None
    out: list[Any] = []
    threads = [threading.Thread(target=lambda: out.append(compiler.matcher(guide))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(out) == 3 and len({id(m) for m in out}) == 3
    assert compiler.cached(guide) is not None
    with pytest.raises(InvalidRequest):
        compiler.matcher(Guide(kind="lark", definition="start: (", param="tools"))


# -- truncation: "auto" -------------------------------------------------------------------------


def conversation() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "SYSTEM RULES"}]
    for i in range(8):
        messages.append({"role": "user", "content": f"question {i} " + "lorem ipsum dolor " * 4})
        messages.append({"role": "assistant", "content": f"answer {i} " + "sit amet " * 4})
        messages.append({"role": "tool", "content": f"result {i}"})
    messages.append({"role": "user", "content": "FINAL"})
    return messages


def test_fit_messages_drops_the_oldest(tokenizer: Any) -> None:
    prompt = Prompt(messages=conversation(), truncate=True)
    full = encode_prompt(tokenizer, prompt)
    limit = len(full) // 2
    ids, dropped, total = fit_messages(tokenizer, prompt, limit)
    assert total == len(full) and len(ids) <= limit and dropped > 0
    kept = prompt.messages[:1] + prompt.messages[1 + dropped :]  # type: ignore[index]
    assert kept[1]["role"] != "tool"  # never a result without its call
    assert ids == encode_prompt(tokenizer, Prompt(messages=kept))
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\nSYSTEM RULES") and "FINAL" in text and "question 0" not in text
    # The fewest messages dropped: the next longer cut does not fit.
    longer = [i for i in range(1, 1 + dropped) if prompt.messages[i]["role"] != "tool"]  # type: ignore[index]
    assert len(encode_prompt(tokenizer, Prompt(messages=prompt.messages[:1] + prompt.messages[longer[-1] :]))) > limit  # type: ignore[index]
    # A prompt that fits is left alone.
    assert fit_messages(tokenizer, prompt, len(full)) == (full, 0, len(full))


def test_fit_messages_keeps_the_last_message_even_if_too_long(tokenizer: Any) -> None:
    prompt = Prompt(messages=conversation(), truncate=True)
    ids, dropped, _ = fit_messages(tokenizer, prompt, 5)
    assert len(ids) > 5 and dropped == len(prompt.messages) - 2  # type: ignore[arg-type]
    assert "FINAL" in tokenizer.decode(ids) and "SYSTEM RULES" in tokenizer.decode(ids)
