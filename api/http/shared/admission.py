"""`Admission`: load shedding before the app reads a body.

A request to a route that runs a model (api/http/shared/routes.py) that arrives while every runtime
able to take it is full gets a 429 + Retry-After at once, in its surface's error shape,
without the app reading or decoding it: shedding must cost less than serving, or overload
feeds itself. "Full" is the one overload rule, `runtime.admission.is_full`, or a token budget
already spent (`Runtime.tokens_spent`: no request of any size fits), which `Runtime.open`
applies to whatever gets through (with each request's own token estimate, which needs its
body). api/http/shared/auth.py calls it after the API key check and before rate limits and
any body read, so a request without a valid key always gets its 401, and a shed request costs
no one's rate budget. A request let through counts against its runtimes from then on
(`entering`), not only once `Runtime.open` admits it.

The runtimes that could take a request come from the method, path, query and headers alone:
the route's task; the model its model header names; for an endpoint route, the served models
the endpoint sends traffic to. A request the app will refuse first for another reason (an
unknown endpoint or model, a required query parameter missing or unknown) is never shed:
its own error comes first, and costs nothing. Imports api.http.shared and runtime.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol
from urllib.parse import parse_qsl

from api.http.shared.edge import current_request_id
from api.http.shared.errors import ErrorShapes
from api.http.shared.routes import match
from runtime.admission import is_full
from runtime.errors import Overloaded

SHED_MESSAGE = "Every request slot is taken; retry shortly."


class EndpointDirectory(Protocol):
    """Named endpoints (api/http/databricks/endpoints.py): `get(name).served`, each entry with
    `.model` and `.traffic_percentage`; `get` raises on an unknown name."""

    def get(self, name: str) -> Any: ...


class Admission:
    def __init__(self, models: Any, endpoints: EndpointDirectory | None = None, errors: ErrorShapes | None = None) -> None:
        self.models = models
        self.endpoints = endpoints  # without it, endpoint routes are not shed here (Runtime.open still refuses)
        self.errors = errors
        self._entering: dict[str, list[Any]] = {}  # edge request id -> the runtimes it may go to

    def candidates(self, scope: dict[str, Any]) -> list[Any]:
        """The runtimes that could serve this request; [] when none runs a model for it."""
        found = match(scope.get("method", ""), scope.get("path", ""))
        if found is None or found[0].runs is None:
            return []
        route, args = found
        if route.query is not None:
            name, allowed = route.query
            query = scope.get("query_string", b"").decode("latin-1")
            if not any(k == name and v in allowed for k, v in parse_qsl(query)):
                return []
        if route.runs == "endpoint":
            return self._endpoint(args.get("name", ""))
        runtimes = [r for r in self.models if r.task == route.runs]
        named = _header(scope, route.model_header.encode()) if route.model_header else None
        return [r for r in runtimes if r.served_name == named] if named else runtimes

    def _endpoint(self, name: str) -> list[Any]:
        if self.endpoints is None or not name:
            return []
        try:
            endpoint = self.endpoints.get(name)
        except Exception:  # unknown endpoint: the view's 404
            return []
        wanted = {e.model for e in endpoint.served if e.traffic_percentage > 0}
        return [r for r in self.models if r.served_name in wanted]

    def overloaded(self, scope: dict[str, Any]) -> bool:
        candidates = self.candidates(scope)
        if not candidates:
            return False
        entering = self._entering_counts()
        return all(r.accepting and (is_full(len(r.requests) + entering.get(id(r), 0), r.config.max_pending) or r.tokens_spent()) for r in candidates)

    # Between being let through and `Runtime.open` a request reads its body, is decoded and
    # validated, milliseconds each; in a burst every request arrived in that window, saw the
    # runtimes empty, and went the whole way to be refused by `Runtime.open` instead (most of a
    # burst's refusals were made there, each costing a full request's work on the event loop:
    # ops/results/performance-history-2026-11-22-to-27.md, "Where a burst's refusals were made").
    # It stops counting as entering once its runtime has it (its edge request id is the engine's:
    # api/http/shared/edge.py, `Runtime.open`) or once it is answered.
    @contextmanager
    def entering(self, scope: dict[str, Any]) -> Iterator[None]:
        """Count this request (let through: not `overloaded`) against the runtimes that could
        take it until one of them admits it, or until it is answered (the block ends)."""
        request_id = current_request_id()
        candidates = self.candidates(scope) if request_id is not None else []
        if not candidates:
            yield
            return
        assert request_id is not None
        self._entering[request_id] = candidates
        try:
            yield
        finally:  # synchronous: also when the client left and the request was cancelled
            self._entering.pop(request_id, None)

    def _entering_counts(self) -> dict[int, int]:
        """Per runtime (by id()), the requests entering it; those admitted since are forgotten."""
        counts: dict[int, int] = {}
        for request_id, runtimes in list(self._entering.items()):
            if any(request_id in r.requests for r in runtimes):
                del self._entering[request_id]  # admitted: `requests` counts it now
                continue
            for r in runtimes:
                counts[id(r)] = counts.get(id(r), 0) + 1
        return counts

    async def refuse(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        # The body is left unread: api/http/shared/body_drain.py reads (and drops) it before this goes
        # out, or closes the connection, as for every early answer.
        assert self.errors is not None, "Admission needs the app's error shapes to refuse"
        await self.errors.send(send, scope, Overloaded(SHED_MESSAGE))


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None
