"""An actor that crashes takes its own model down, not the server: live requests get a clean
503, /health says why, the model refuses new work at once, and the other models carry on."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from tests.support.servers import start_server, tiny_config

pytestmark = pytest.mark.in_process  # the engine in the server's process (tests/conftest.py)


async def test_a_crashed_actor_fails_its_model_only(tiny_model_dir: Path) -> None:
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, tiny_config(tiny_model_dir), tiny_config(tiny_model_dir, served_name="other"))
        doomed, other = srv.runtimes  # type: ignore[misc]

        def crash(*args: object) -> None:
            raise RuntimeError("injected scheduler bug")

        doomed.scheduler.core.update = crash  # type: ignore[attr-defined]
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as http:
            assert (await http.get("/health")).status_code == 200
            body = {"prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True}  # unseeded: EOS may come early otherwise
            with trio.fail_after(10):
                failed = await http.post("/v1/completions", json={"model": "tiny", **body})
            assert failed.status_code == 503, failed.text
            message = failed.json()["error"]["message"]  # what broke goes to the log (and /health), not to the client
            assert "injected" not in message and f"request id {failed.headers['x-request-id']}" in message, message

            health = await http.get("/health")
            assert health.status_code == 503 and "injected scheduler bug" in health.text
            again = await http.post("/v1/completions", json={"model": "tiny", **body})
            assert again.status_code == 503
            assert not doomed.requests  # type: ignore[attr-defined]

            ok = await http.post("/v1/completions", json={"model": "other", **body})
            assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
            assert other.health() == (True, None)  # type: ignore[attr-defined]
        srv.stop.set()
