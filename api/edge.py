"""The HTTP edge: request ids, the access log line, per-request HTTP metrics, load shedding.

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
  the app's URL map; "unmatched" only when no route has that path (labels stay bounded).

And `Admission`, the load-shedding gate, which api/auth.py calls after the API key check and
before rate limits and any body read (so a request without a valid key always gets its 401,
and a shed request costs no one's rate budget): a request to any generation route
(/v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, Azure's
/chat/completions, /serving-endpoints/{name}/invocations) that arrives while every runtime
able to take it is at `max_pending`, or has spent its token budget (`Runtime.tokens_spent`),
gets a 429 + Retry-After at once, in its surface's error shape, without the app reading or
decoding it (shedding must cost less than serving, or overload feeds itself). `Runtime.open`
applies the same rules to what gets through, and the token budget to each request's own
estimate (which needs its body).

Route and model are learnt from inside the app through a per-request `EdgeInfo` that the
app's hooks fill in (`note_route`, `note_model`); contextvars flow from this task into the
handler's tasks, and the object is shared, so the app's writes are visible here.
Imports structlog, werkzeug, api and runtime. Cleanup is synchronous: a cancelled request must still log.
"""

from __future__ import annotations

import os
import time
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import count
from typing import Any
from urllib.parse import parse_qsl

import msgspec
import structlog
from werkzeug.exceptions import MethodNotAllowed

from api.errors import surface_error
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
_INVOCATIONS = ("/serving-endpoints/", "/invocations")
AZURE_CHAT = "/chat/completions"


def runs_model(path: str) -> bool:
    """Whether a POST to `path` runs a model: the one list of generation routes (shedding here,
    token rate limits in api/auth.py, streamed responses in api/openapi.py)."""
    return path in _GENERATION_ROUTES or path == AZURE_CHAT or (path.startswith(_INVOCATIONS[0]) and path.endswith(_INVOCATIONS[1]))

SHED_MESSAGE = "Every request slot is taken; retry shortly."


class Admission:
    """Load shedding from the method, path, query and headers alone (see the module docstring).

    `endpoints` (api.serving_endpoints.ServingEndpoints) is set by api/platform.py; without it,
    invocations are not shed here (Runtime.open still refuses them)."""

    def __init__(self, models: ModelRegistry, endpoints: Any = None) -> None:
        from api.routes.azure import API_VERSIONS

        self.models = models
        self.endpoints = endpoints
        self._api_versions = frozenset(API_VERSIONS)

    def candidates(self, scope: dict[str, Any]) -> list[Any]:
        """The runtimes that could serve this request; [] when it is not a generation request
        (or one the app will refuse for another reason first: an unknown endpoint or model,
        a bad api-version)."""
        if scope.get("method") != "POST":
            return []
        path = scope.get("path", "")
        task = _GENERATION_ROUTES.get(path)
        if task is not None:
            return [r for r in self.models if r.task == task]
        if path == AZURE_CHAT:
            return self._azure(scope)
        if path.startswith(_INVOCATIONS[0]) and path.endswith(_INVOCATIONS[1]):
            return self._invocation(path[len(_INVOCATIONS[0]) : -len(_INVOCATIONS[1])])
        return []

    def _azure(self, scope: dict[str, Any]) -> list[Any]:
        query = scope.get("query_string", b"").decode("latin-1")
        if not any(k == "api-version" and v in self._api_versions for k, v in parse_qsl(query)):
            return []  # the view's 400 naming api-version comes first, and costs nothing
        deployment = _header(scope, b"azureml-model-deployment")
        if deployment:
            return [r for r in self.models if r.served_name == deployment and r.task == "generate"]
        return [r for r in self.models if r.task == "generate"]

    def _invocation(self, name: str) -> list[Any]:
        if self.endpoints is None or not name or "/" in name:
            return []
        try:
            endpoint = self.endpoints.get(name)
        except Exception:  # unknown endpoint: the view's 404
            return []
        wanted = {e.model for e in endpoint.served if e.traffic_percentage > 0}
        return [r for r in self.models if r.served_name in wanted]

    def overloaded(self, scope: dict[str, Any]) -> bool:
        candidates = self.candidates(scope)
        return bool(candidates) and all(r.accepting and (len(r.requests) >= r.config.max_pending or r.tokens_spent()) for r in candidates)

    async def refuse(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        # The body is left unread: api/body_drain.py reads (and drops) it before this goes out,
        # or closes the connection, as for every early answer.
        body, extra = surface_error(scope.get("path", ""), Overloaded.status, SHED_MESSAGE, scope.get("query_string", b""), code=Overloaded.code)
        raw = msgspec.json.encode(body)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(raw)).encode()),
            (b"retry-after", b"1"),
            *((k.lower().encode(), v.encode()) for k, v in extra.items()),
        ]
        await send({"type": "http.response.start", "status": Overloaded.status, "headers": headers})
        await send({"type": "http.response.body", "body": raw, "more_body": False})


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


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
    def __init__(self, app: Any, metrics: ServerMetrics, models: ModelRegistry, url_map: Any = None) -> None:
        self.app = app
        self.metrics = metrics
        self.models = models
        self.url_map = url_map  # the app's werkzeug Map: route templates of requests it never routed
        self._adapter: Any = None

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
                    await self.app(scope, receive, send_wrapper)
                finally:
                    self._record(scope, info, time.perf_counter() - started)
        finally:
            _current.reset(token)

    def route_of(self, method: str, path: str) -> str:
        """The route template `method path` matches in the app's URL map (a path served under
        another method still names its template), or "unmatched"."""
        if self.url_map is None:
            return "unmatched"
        if self._adapter is None:
            self._adapter = self.url_map.bind("localhost")
        try:
            rule, _ = self._adapter.match(path, method=method, return_rule=True)
        except MethodNotAllowed as exc:
            allowed = [m for m in exc.valid_methods or () if m not in ("OPTIONS", "HEAD")]
            if not allowed:
                return "unmatched"
            try:
                rule, _ = self._adapter.match(path, method=allowed[0], return_rule=True)
            except Exception:
                return "unmatched"
        except Exception:  # NotFound, a redirect, a malformed path
            return "unmatched"
        return str(rule.rule)

    def _record(self, scope: dict[str, Any], info: EdgeInfo, seconds: float) -> None:
        status = info.status if info.completed and info.status is not None else CLIENT_CLOSED
        route = info.route or self.route_of(scope.get("method", "GET"), scope.get("path", ""))
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
