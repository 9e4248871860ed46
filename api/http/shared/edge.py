"""The HTTP edge: request ids, the access log line, per-request HTTP metrics.

Owns: `EdgeMiddleware`, the outermost ASGI wrapper around the app. For every HTTP request it
- makes a request id, binds it to structlog's context (so every log line of the request,
  and `Runtime.open`, which adopts it as the engine's request id, carry it) and returns it
  as `X-Request-Id`;
- writes one `http_request` access line when the response ends (or the client leaves):
  method, path, route template, model, status, duration, bytes. Never bodies;
- counts the request in `ServerMetrics` by route template, model and status. A response the
  client abandoned before its last byte counts as 499 (nginx's "client closed request").
  The route label is the template the app matched, or, for a request answered before the app
  routed it (a 401, a rate limit, a shed request), the template its method and path match in
  the route table; "unmatched" only when no route has that path (labels stay bounded).

Route and model are learnt from inside the app through a per-request `EdgeInfo` that the
app's hooks fill in (`note_route`, `note_model`); contextvars flow from this task into the
handler's tasks, and the object is shared, so the app's writes are visible here.
Imports structlog, api.http.shared and runtime. Cleanup is synchronous: a cancelled request must still log.
"""

from __future__ import annotations

import os
import time
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import count
from typing import Any

import structlog

from api.http.shared.routes import template
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


def new_request_id() -> str:
    return f"{_prefix}{next(_counter):08x}"


def current_request_id() -> str | None:
    """The id of the request being served here (the engine's too: `Runtime.open` adopts it)."""
    info = _current.get()
    return info.request_id if info is not None else None


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

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
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
                    await self.app(scope, receive, send_wrapper)
                finally:
                    self._record(scope, info, time.perf_counter() - started)
        finally:
            _current.reset(token)

    def _record(self, scope: dict[str, Any], info: EdgeInfo, seconds: float) -> None:
        status = info.status if info.completed and info.status is not None else CLIENT_CLOSED
        route = info.route or template(scope.get("method", "GET"), scope.get("path", "")) or "unmatched"
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
            return info.model
        if info.model is None:
            task = "embed" if info.route and "embedding" in info.route else "generate"
            for runtime in self.models:
                if runtime.task == task:
                    return runtime.served_name
        return ""
