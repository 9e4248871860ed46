"""The HTTP edge: request ids, the access log line, and per-request HTTP metrics.

Owns: `EdgeMiddleware`, an ASGI wrapper around the Quart app. For every HTTP request it
- makes a request id, binds it to structlog's context (so every log line of the request,
  and `Runtime.open`, which adopts it as the engine's request id, carry it) and returns it
  as `X-Request-Id`;
- writes one `http_request` access line when the response ends (or the client leaves):
  method, path, route template, model, status, duration, bytes. Never bodies;
- counts the request in `ServerMetrics` by route template, model and status. A response the
  client abandoned before its last byte counts as 499 (nginx's "client closed request");
- sheds load: a generation request that arrives while every runtime able to take it is at
  `max_pending` gets its 429 here, without the app decoding it (shedding must cost less than
  serving, or overload feeds itself).

Route and model are learnt from inside the app through a per-request `EdgeInfo` that the
app's hooks fill in (`note_route`, `note_model`); contextvars flow from this task into the
handler's tasks, and the object is shared, so the app's writes are visible here.
Imports structlog, api and runtime. Cleanup is synchronous: a cancelled request must still log.
"""

from __future__ import annotations

import os
import time
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import count
from typing import Any

import msgspec
import structlog

from api.errors import error_body
from runtime.errors import Overloaded
from runtime.logging import get_logger
from runtime.metrics import ServerMetrics
from runtime.registry import ModelRegistry

log = get_logger("http")

CLIENT_CLOSED = 499

_current: ContextVar[EdgeInfo | None] = ContextVar("switchyard_edge", default=None)
_prefix = os.urandom(4).hex()
_counter = count()


@dataclass(slots=True, eq=False)
class EdgeInfo:
    request_id: str
    route: str | None = None
    model: str | None = None
    decoded: bool = False  # a request body struct was decoded (so the route needed a model)
    status: int | None = None
    bytes_sent: int = 0
    completed: bool = False


_GENERATION_ROUTES = {
    "/v1/chat/completions": "generate",
    "/v1/completions": "generate",
    "/v1/responses": "generate",
    "/v1/embeddings": "embed",
}
_SHED_BODY = msgspec.json.encode(
    error_body("Every request slot is taken; retry shortly.", Overloaded.type, None, Overloaded.code)
)


async def _shed(receive: Any, send: Any) -> None:
    # Read (and drop) the body first: answering mid-upload would leave the client a reset
    # connection instead of a 429 it can act on.
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            break
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(_SHED_BODY)).encode()),
        (b"retry-after", b"1"),
    ]
    await send({"type": "http.response.start", "status": Overloaded.status, "headers": headers})
    await send({"type": "http.response.body", "body": _SHED_BODY, "more_body": False})


def new_request_id() -> str:
    return f"{_prefix}{next(_counter):08x}"


def note_route(rule: str | None) -> None:
    info = _current.get()
    if info is not None:
        info.route = rule


def note_model(model: str | None) -> None:
    info = _current.get()
    if info is not None:
        info.model = model
        info.decoded = True


class EdgeMiddleware:
    def __init__(self, app: Any, metrics: ServerMetrics, models: ModelRegistry) -> None:
        self.app = app
        self.metrics = metrics
        self.models = models

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        info = EdgeInfo(new_request_id())
        header = info.request_id.encode()

        async def send_wrapper(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                info.status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", header)]}
            elif message["type"] == "http.response.body":
                info.bytes_sent += len(message.get("body", b""))
                if not message.get("more_body", False):
                    info.completed = True
            await send(message)

        started = time.perf_counter()
        token = _current.set(info)
        try:
            with structlog.contextvars.bound_contextvars(request_id=info.request_id):
                try:
                    if self._all_full(scope):
                        info.route = scope["path"]
                        await _shed(receive, send_wrapper)
                    else:
                        await self.app(scope, receive, send_wrapper)
                finally:
                    self._record(scope, info, time.perf_counter() - started)
        finally:
            _current.reset(token)

    def _all_full(self, scope: dict[str, Any]) -> bool:
        """Load shedding before any parsing: a generation request while every runtime that
        could take it is at max_pending is refused here, at a fraction of the app's cost.
        (Runtime.open applies the same rule, and the token budget, to what gets through.)"""
        task = _GENERATION_ROUTES.get(scope["path"]) if scope.get("method") == "POST" else None
        if task is None:
            return False
        candidates = [r for r in self.models if r.task == task]
        return bool(candidates) and all(r.accepting and len(r.requests) >= r.config.max_pending for r in candidates)

    def _record(self, scope: dict[str, Any], info: EdgeInfo, seconds: float) -> None:
        status = info.status if info.completed and info.status is not None else CLIENT_CLOSED
        route = info.route or "unmatched"
        model = self._model_label(info)
        self.metrics.observe_http(route, model, status, seconds)
        client = scope.get("client")
        log.info(
            "http_request",
            method=scope.get("method"),
            path=scope.get("path"),
            route=route,
            model=model or None,
            status=status,
            duration_s=round(seconds, 6),
            bytes_sent=info.bytes_sent,
            client=f"{client[0]}:{client[1]}" if client else None,
        )

    def _model_label(self, info: EdgeInfo) -> str:
        """A served model's name, or "" (never a client's string: labels must stay bounded)."""
        if not info.decoded:
            return ""
        names = {runtime.served_name: runtime for runtime in self.models}
        if info.model in names:
            return info.model  # type: ignore[return-value]
        if info.model is None:
            task = "embed" if info.route and "embedding" in info.route else "generate"
            for runtime in self.models:
                if runtime.task == task:
                    return runtime.served_name
        return ""
