"""`ReplicaFailureGuard`: the ASGI middleware Ray Serve's HTTP proxy runs around every request,
so that a model replica dying ends its responses as Switchyard's own edge would.

Why: on the direct topology (api/cluster/deploy.py) no Switchyard process sits between Ray's
proxy and a model replica, and when a replica dies Ray's proxy ends the response its own way:
a bare 500 before the response started, and mid-stream nothing more (the client reads a cut
body with no `[DONE]`). The guard watches the messages the proxy sends and, when the proxy's
app returns with a response unfinished and the client still there, finishes it with
api/cluster/edge.py's `end_cleanly`: a 503 in the API's own error shape before the start, an
SSE error event and `[DONE]` mid-stream. On the relay topology the ingress already does that,
and the guard only sees finished responses.

Ray loads it in the proxy's process from RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH
(`PROXY_CALLBACK`), which deploy.py sets before starting a local Ray instance; a cluster one
joins needs it set in its nodes' environment (docs/scaling-out.md, "Failure behaviour"). Imports api (no torch).
"""

from __future__ import annotations

from typing import Any

from api.cluster.edge import Progress, end_cleanly

PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "api.cluster.proxy_guard.middlewares"
UNFINISHED = "the replica's call ended before its response did"


def middlewares() -> list[Any]:
    """Ray's proxy calls this once at start (the callback's contract: Starlette middlewares)."""
    from starlette.middleware import Middleware

    return [Middleware(ReplicaFailureGuard)]


class ReplicaFailureGuard:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        progress = Progress()
        client_left = False

        async def watched_receive() -> dict[str, Any]:
            nonlocal client_left
            message = await receive()
            client_left = client_left or message["type"] == "http.disconnect"
            return message

        async def watched_send(message: dict[str, Any]) -> None:
            progress.saw(message)
            await send(message)

        error = UNFINISHED
        try:
            await self.app(scope, watched_receive, watched_send)
        except Exception as exc:  # noqa: BLE001 - the proxy's app failed: the client still gets an answer
            error = repr(exc)
        if not progress.finished and not client_left:
            await end_cleanly(send, scope, progress, error)
