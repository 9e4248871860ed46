"""api/cluster/config_store.py's single writer, without Ray: compare-and-set on
config_version, idempotent re-declaration, persistence, and the long-poll watch."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from api.cluster.config_store import ConfigConflict, EndpointConfigActor


def definition(version: int, percent: int = 100, **extra: object) -> str:
    served = [{"name": "a", "model": "tiny", "traffic_percentage": percent}]
    return json.dumps({"name": "e", "id": f"id-{version}", "served": served, "config_version": version, **extra})


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_writes_are_compare_and_set_and_persist(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.sqlite3"

    async def scenario() -> None:
        actor = EndpointConfigActor(str(path))
        await actor.put("e", definition(1))
        with pytest.raises(ConfigConflict):
            await actor.put("e", definition(1, 50))  # a second create of the same name
        await actor.put("e", definition(2, 100))  # builds on version 1
        with pytest.raises(ConfigConflict):
            await actor.put("e", definition(2, 40))  # another writer also built on version 1
        with pytest.raises(ConfigConflict):
            await actor.put("e", definition(4))  # skips a version
        await actor.put("e", definition(2, 100))  # exactly what is stored: a no-op, not a conflict
        # Two writers at once that both built on version 2: one wins (calls interleave in an
        # async actor, so this needs the lock from check to commit).
        results = await asyncio.gather(actor.put("e", definition(3, 10)), actor.put("e", definition(3, 90)), return_exceptions=True)
        assert sorted(type(r).__name__ for r in results) == ["ConfigConflict", "NoneType"], results

    run(scenario())
    stored = json.loads(EndpointConfigActor(str(path))._file._load_sync()["e"])
    assert stored["config_version"] == 3


def test_watch_returns_when_the_version_moves(tmp_path: Path) -> None:
    async def scenario() -> None:
        actor = EndpointConfigActor(str(tmp_path / "db.sqlite3"))
        version, stored = await actor.watch("r1", -1)  # unknown version: at once
        assert stored == {}
        waiting = asyncio.create_task(actor.watch("r1", version))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await actor.put("e", definition(1))
        new_version, stored = await asyncio.wait_for(waiting, 2)
        assert new_version == version + 1 and set(stored) == {"e"}
        assert (await actor.applied()) == {"r1": version}
        await actor.delete("e")
        assert (await actor.snapshot())[1] == {}

    run(scenario())


def test_stop_reaches_every_waiting_replica(tmp_path: Path) -> None:
    async def scenario() -> None:
        actor = EndpointConfigActor(str(tmp_path / "db.sqlite3"))
        waiting = [asyncio.create_task(actor.wait_stop()) for _ in range(3)]  # three replicas
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waiting)
        await actor.stop_serving()
        await asyncio.wait_for(asyncio.gather(*waiting), 2)
        await asyncio.wait_for(actor.wait_stop(), 2)  # a replica that asks later drains at once

    run(scenario())


def test_run_time_adapters_reach_watchers_and_a_stopped_replica_is_not_waited_for(tmp_path: Path) -> None:
    """The deployment's run-time LoRA adapters: a change wakes the watchers with the new list;
    `adapters_applied` lists each watching replica's version, without one that left or one
    whose last watch is older than a watch's length (it died without leaving)."""

    async def scenario() -> None:
        actor = EndpointConfigActor(str(tmp_path / "endpoints.sqlite3"))
        version, adapters = await actor.watch_adapters("r1", -1)
        assert adapters == {}
        waiting = asyncio.ensure_future(actor.watch_adapters("r1", version))
        await asyncio.sleep(0)
        new = await actor.set_adapter("q", "qv-r4")
        assert await asyncio.wait_for(waiting, 1) == (new, {"q": "qv-r4"})
        await actor.watch_adapters("r2", -1)  # r2 has the new list; r1 has not come back yet
        assert await actor.adapters_applied() == {"r1": version, "r2": -1}
        await actor.leave("r1")
        assert await actor.adapters_applied() == {"r2": -1}
        assert await actor.adapters_applied(max_age_s=0.0) == {}  # a replica that stopped calling
        assert (await actor.set_adapter("q", None)) == new + 1 and (await actor.watch_adapters("r2", new))[1] == {}

    run(scenario())
