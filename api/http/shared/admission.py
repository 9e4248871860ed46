"""`Admission`: load shedding before the app reads a body.

A request to a route that runs a model (api/http/shared/routes.py) that arrives while every runtime
able to take it is full gets a 429 + Retry-After at once, in its surface's error shape,
without the app reading or decoding it: shedding must cost less than serving, or overload
feeds itself. "Full" is the one overload rule, `runtime.admission.is_full`, or a token budget
already spent (`Runtime.tokens_spent`: no request of any size fits), which `Runtime.open`
applies to whatever gets through (with each request's own token estimate, which needs its
body). api/http/shared/auth.py
calls it after the API key check and before rate limits and any body read, so a request
without a valid key always gets its 401, and a shed request costs no one's rate budget.

The runtimes that could take a request come from the method, path, query and headers alone:
the route's task; the model its model header names; for an endpoint route, the served models
the endpoint sends traffic to. A request the app will refuse first for another reason (an
unknown endpoint or model, a required query parameter missing or unknown) is never shed:
its own error comes first, and costs nothing. Imports api.http.shared and runtime.
"""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import parse_qsl

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
        return bool(candidates) and all(r.accepting and (is_full(len(r.requests), r.config.max_pending) or r.tokens_spent()) for r in candidates)

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
