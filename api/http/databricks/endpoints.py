"""Serving endpoints (Databricks' model): named routes to one or more served models.

Owns: the endpoint definitions and their rules, apart from HTTP (api/http/databricks/routes.py)
and disk (api/http/databricks/store.py):
- every served model is also a built-in, read-only endpoint under its own name;
- a defined endpoint holds served entities (each a name within the endpoint and the served
  model it runs) and a traffic split over them, in whole percentages summing to 100, for A/B
  tests. All of an endpoint's models must have the same task (chat and a text model may share
  an endpoint; an embedding model may not), since clients send one request format;
- changes swap one immutable `Endpoint` for another, so a request that already chose its
  model keeps it: an update or a delete never touches in-flight requests, and needs no
  restart. Each change is written to the store before it is applied (and shielded from
  cancellation in between), so what the API acknowledged is what a restart loads;
- endpoints declared in the config file (`check_declared` at start-up, `apply_declared` once
  the store is loaded) go through the same rules and the same store.

Imports msgspec, trio, api.http.databricks, api.http.platform and runtime.
"""

from __future__ import annotations

import random
import re
import sqlite3
import time
import uuid
from collections.abc import Awaitable
from typing import Annotated, Any

import msgspec
import trio
from msgspec import Meta

from api.http.databricks.store import EndpointStore
from api.http.platform.config import ConfigError
from runtime.errors import InvalidRequest, ServingError
from runtime.logging import get_logger
from runtime.registry import ModelRegistry

log = get_logger("endpoints")

NAME = re.compile(r"^[A-Za-z0-9_-]{1,63}$")
MAX_SERVED = 15
TASKS = {"generate": "llm/v1/chat", "embed": "llm/v1/embeddings"}


class EndpointNotFound(ServingError):
    status = 404
    type = "invalid_request_error"
    code = "RESOURCE_DOES_NOT_EXIST"

    def __init__(self, name: str) -> None:
        super().__init__(f"Serving endpoint {name!r} does not exist.")


class EndpointExists(ServingError):
    status = 409
    type = "invalid_request_error"
    code = "RESOURCE_ALREADY_EXISTS"

    def __init__(self, name: str) -> None:
        super().__init__(f"Serving endpoint {name!r} already exists.")


class EndpointUnavailable(ServingError):
    status = 503
    type = "server_error"
    code = "TEMPORARILY_UNAVAILABLE"


class EndpointNotStored(ServingError):
    status = 500
    type = "server_error"
    code = "INTERNAL_ERROR"


def _invalid(message: str, param: str | None = None) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="INVALID_PARAMETER_VALUE")


# -- request bodies (Databricks' field names; unknown fields are accepted and ignored) --------

Percentage = Annotated[int, Meta(ge=0, le=100)]


class ServedEntityInput(msgspec.Struct, kw_only=True):
    entity_name: str | None = None  # served_entities[]
    model_name: str | None = None  # served_models[] (Databricks' older name for the same thing)
    entity_version: str | None = None
    model_version: str | None = None
    name: str | None = None
    workload_size: str | None = None
    scale_to_zero_enabled: bool | None = None


class RouteInput(msgspec.Struct, kw_only=True):
    traffic_percentage: Percentage
    served_model_name: str | None = None
    served_entity_name: str | None = None


class TrafficConfigInput(msgspec.Struct, kw_only=True):
    routes: list[RouteInput] = []


class EndpointConfigInput(msgspec.Struct, kw_only=True):
    served_entities: list[ServedEntityInput] | None = None
    served_models: list[ServedEntityInput] | None = None
    traffic_config: TrafficConfigInput | None = None


class CreateEndpointRequest(msgspec.Struct, kw_only=True):
    name: str
    config: EndpointConfigInput | None = None
    tags: list[dict[str, str]] | None = None
    description: str | None = None


# -- the definitions ------------------------------------------------------------------------


class ServedEntity(msgspec.Struct, frozen=True, kw_only=True):
    name: str  # within the endpoint: what traffic routes and the served-model-name header name
    model: str  # the served model (ModelRegistry name) that runs it
    version: str | None = None
    workload_size: str | None = None
    scale_to_zero_enabled: bool | None = None
    traffic_percentage: int = 0


class Endpoint(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    id: str
    served: tuple[ServedEntity, ...]
    config_version: int = 1
    created_ms: int = 0
    updated_ms: int = 0
    tags: tuple[tuple[str, str], ...] = ()
    description: str | None = None
    builtin: bool = False

    def choose(self, rng: random.Random) -> ServedEntity:
        """One served entity, drawn with its traffic percentage as its probability."""
        draw = rng.randrange(100)
        for entity in self.served:
            draw -= entity.traffic_percentage
            if draw < 0:
                return entity
        raise AssertionError("traffic percentages must sum to 100")


def build_served(config: EndpointConfigInput | None, models: ModelRegistry) -> tuple[ServedEntity, ...]:
    """Validate a config against the served models; the entities with their percentages."""
    if config is None:
        raise _invalid("config is required: give served_entities (or served_models).", "config")
    if config.served_entities and config.served_models:
        raise _invalid("Give served_entities or served_models, not both.", "config.served_models")
    field = "served_entities" if config.served_entities else "served_models"
    inputs = config.served_entities or config.served_models or []
    if not inputs:
        raise _invalid("An endpoint needs at least one served entity.", "config.served_entities")
    if len(inputs) > MAX_SERVED:
        raise _invalid(f"An endpoint serves at most {MAX_SERVED} entities.", f"config.{field}")
    by_name = {runtime.served_name: runtime for runtime in models.served()}
    entities: list[ServedEntity] = []
    tasks = set()
    for i, item in enumerate(inputs):
        model = item.entity_name or item.model_name
        version = item.entity_version or item.model_version
        if not model:
            raise _invalid("Each served entity needs entity_name (or model_name).", f"config.{field}[{i}].entity_name")
        runtime = by_name.get(model)
        if runtime is None:
            raise _invalid(f"{model!r} is not a model this server serves ({', '.join(sorted(by_name))}).", f"config.{field}[{i}].entity_name")
        tasks.add(runtime.task)
        name = item.name or (f"{model}-{version}" if version else model)
        if not NAME.match(name):
            raise _invalid(f"Served entity name {name!r} may use only letters, digits, - and _.", f"config.{field}[{i}].name")
        if any(e.name == name for e in entities):
            raise _invalid(f"Two served entities are named {name!r}.", f"config.{field}[{i}].name")
        entities.append(
            ServedEntity(name=name, model=model, version=version, workload_size=item.workload_size, scale_to_zero_enabled=item.scale_to_zero_enabled)
        )
    if len(tasks) > 1:
        raise _invalid("All served entities of an endpoint must expose the same API format (task).", f"config.{field}")
    return _with_traffic(entities, config.traffic_config)


def _with_traffic(entities: list[ServedEntity], traffic: TrafficConfigInput | None) -> tuple[ServedEntity, ...]:
    if traffic is None or not traffic.routes:
        if len(entities) > 1:
            raise _invalid("traffic_config is required when an endpoint serves several entities.", "config.traffic_config")
        return (msgspec.structs.replace(entities[0], traffic_percentage=100),)
    percent: dict[str, int] = {}
    for i, route in enumerate(traffic.routes):
        name = route.served_entity_name or route.served_model_name
        if name is None or all(e.name != name for e in entities):
            raise _invalid(f"Route {i} names {name!r}, which is not a served entity of this endpoint.", f"config.traffic_config.routes[{i}].served_model_name")
        if name in percent:
            raise _invalid(f"Two routes name {name!r}.", f"config.traffic_config.routes[{i}].served_model_name")
        percent[name] = route.traffic_percentage
    total = sum(percent.values())
    if total != 100:
        raise _invalid(f"Traffic percentages sum to {total}, not 100.", "config.traffic_config.routes")
    return tuple(msgspec.structs.replace(e, traffic_percentage=percent.get(e.name, 0)) for e in entities)


class ServingEndpoints:
    """The endpoints of one server: built-in ones (one per served model) and defined ones."""

    def __init__(self, models: ModelRegistry, store: EndpointStore, rng: random.Random | None = None) -> None:
        self.models = models
        self.store = store
        self.rng = rng or random.Random()
        self._defined: dict[str, Endpoint] = {}
        self._lock = trio.Lock()

    async def load(self) -> None:
        self.adopt(await self.store.load())
        log.info("endpoints_loaded", count=len(self._defined), path=str(self.store.path))

    def adopt(self, stored: dict[str, str]) -> None:
        """Take every definition from the store's snapshot (name -> JSON) in one swap: at start,
        and on a cluster replica whenever the shared store changes (api/cluster/config_store.py)."""
        decoder = msgspec.json.Decoder(Endpoint)
        served = {runtime.served_name for runtime in self.models.served()}
        defined: dict[str, Endpoint] = {}
        for name, text in stored.items():
            try:
                defined[name] = decoder.decode(text)
            except msgspec.DecodeError as exc:
                log.error("endpoint_unreadable", endpoint=name, error=str(exc))
                continue
            if name in served:  # a model added since: the defined endpoint keeps the name
                log.warning("endpoint_shadows_model", endpoint=name)
        self._defined = defined

    # -- reads: synchronous, on the current snapshot ------------------------------------------

    def _builtin(self, name: str) -> Endpoint | None:
        for runtime in self.models.served():
            if runtime.served_name == name:
                entity = ServedEntity(name=name, model=name, traffic_percentage=100)
                stamp = runtime.created * 1000
                return Endpoint(name=name, id=f"builtin-{name}", served=(entity,), created_ms=stamp, updated_ms=stamp, builtin=True)
        return None

    def get(self, name: str) -> Endpoint:
        endpoint = self._defined.get(name) or self._builtin(name)
        if endpoint is None:
            raise EndpointNotFound(name)
        return endpoint

    def all(self) -> list[Endpoint]:
        builtin = [e for r in self.models.served() if r.served_name not in self._defined and (e := self._builtin(r.served_name))]
        return builtin + sorted(self._defined.values(), key=lambda e: e.name)

    def task(self, endpoint: Endpoint) -> str | None:
        """The endpoint's task ("generate" or "embed"), or None when none of its models is served."""
        by_name = {runtime.served_name: runtime for runtime in self.models.served()}
        for entity in endpoint.served:
            if entity.model in by_name:
                return by_name[entity.model].task
        return None

    def ready(self, endpoint: Endpoint) -> bool:
        names = {runtime.served_name for runtime in self.models.served()}
        return all(entity.model in names for entity in endpoint.served)

    def route(self, name: str) -> ServedEntity:
        """The served entity this request goes to, drawn by the endpoint's traffic split."""
        endpoint = self.get(name)
        entity = endpoint.choose(self.rng)
        if entity.model not in {runtime.served_name for runtime in self.models.served()}:
            raise EndpointUnavailable(f"Served entity {entity.name!r} of endpoint {name!r} runs {entity.model!r}, which this server does not serve.")
        return entity

    # -- writes: validated, stored, then swapped in ---------------------------------------------

    async def create(self, req: CreateEndpointRequest) -> Endpoint:
        if not NAME.match(req.name):
            raise _invalid("An endpoint name has 1-63 letters, digits, - or _.", "name")
        served = build_served(req.config, self.models)
        async with self._lock:
            if req.name in self._defined or self._builtin(req.name) is not None:
                raise EndpointExists(req.name)
            now = _now_ms()
            endpoint = Endpoint(
                name=req.name,
                id=uuid.uuid4().hex,
                served=served,
                created_ms=now,
                updated_ms=now,
                tags=tuple((t.get("key", ""), t.get("value", "")) for t in req.tags or ()),
                description=req.description,
            )
            await self._commit(endpoint)
        log.info("endpoint_created", endpoint=endpoint.name, served=_summary(endpoint))
        return endpoint

    async def update_config(self, name: str, config: EndpointConfigInput) -> Endpoint:
        """New served entities and/or traffic. Traffic alone keeps the entities it routes to."""
        keep = not (config.served_entities or config.served_models)
        if keep and config.traffic_config is None:
            raise _invalid("Give served_entities (or served_models) and/or traffic_config.", "served_entities")
        served = None if keep else build_served(config, self.models)
        async with self._lock:
            current = self._defined.get(name)
            if current is None:
                if self._builtin(name) is not None:
                    raise _invalid(f"{name!r} is the built-in endpoint of a served model and cannot be changed; create an endpoint instead.", "name")
                raise EndpointNotFound(name)
            if served is None:
                served = _with_traffic(list(current.served), config.traffic_config)
            endpoint = msgspec.structs.replace(current, served=served, config_version=current.config_version + 1, updated_ms=_now_ms())
            await self._commit(endpoint)
        log.info("endpoint_updated", endpoint=name, config_version=endpoint.config_version, served=_summary(endpoint))
        return endpoint

    def check_declared(self, specs: Any) -> list[tuple[CreateEndpointRequest, tuple[ServedEntity, ...]]]:
        """Validate the config file's endpoints against the served models, before serving.
        Raises ConfigError naming the endpoint and what is wrong with it."""
        checked: list[tuple[CreateEndpointRequest, tuple[ServedEntity, ...]]] = []
        seen: set[str] = set()
        for req in specs:
            where = f"[[endpoints]] {req.name!r}"
            if not NAME.match(req.name):
                raise ConfigError(f"{where}: an endpoint name has 1-63 letters, digits, - or _")
            if req.name in seen:
                raise ConfigError(f"{where}: declared twice")
            if self._builtin(req.name) is not None:
                raise ConfigError(f"{where}: a served model already has that name (every model is an endpoint under its own name)")
            seen.add(req.name)
            try:
                served = build_served(req.config, self.models)
            except InvalidRequest as exc:
                raise ConfigError(f"{where}: {exc}") from None
            checked.append((req, served))
        return checked

    async def apply_declared(self, declared: list[tuple[CreateEndpointRequest, tuple[ServedEntity, ...]]]) -> None:
        """Make the store agree with the config file's endpoints (see api/http/databricks/declared.py)."""
        for req, served in declared:
            tags = tuple((t.get("key", ""), t.get("value", "")) for t in req.tags or ())
            async with self._lock:
                current = self._defined.get(req.name)
                if current is not None and (current.served, current.tags, current.description) == (served, tags, req.description):
                    continue
                now = _now_ms()
                if current is None:
                    endpoint = Endpoint(name=req.name, id=uuid.uuid4().hex, served=served, created_ms=now, updated_ms=now, tags=tags, description=req.description)
                else:
                    endpoint = msgspec.structs.replace(
                        current, served=served, tags=tags, description=req.description, config_version=current.config_version + 1, updated_ms=now
                    )
                await self._commit(endpoint)
            log.info("endpoint_declared", endpoint=req.name, config_version=endpoint.config_version, served=_summary(endpoint))

    async def delete(self, name: str) -> None:
        async with self._lock:
            if name not in self._defined:
                if self._builtin(name) is not None:
                    raise _invalid(f"{name!r} is the built-in endpoint of a served model and cannot be deleted.", "name")
                raise EndpointNotFound(name)
            with trio.CancelScope(shield=True):
                await self._write(self.store.delete(name), name)
                del self._defined[name]
        log.info("endpoint_deleted", endpoint=name)

    async def _commit(self, endpoint: Endpoint) -> None:
        # Shielded: a client leaving mid-write must not leave the disk and memory disagreeing.
        with trio.CancelScope(shield=True):
            await self._write(self.store.put(endpoint.name, msgspec.json.encode(endpoint).decode()), endpoint.name)
            self._defined[endpoint.name] = endpoint

    async def _write(self, operation: Awaitable[None], name: str) -> None:
        try:
            await operation
        except (OSError, sqlite3.Error) as exc:
            log.error("endpoint_store_failed", endpoint=name, path=str(self.store.path), error=repr(exc))
            raise EndpointNotStored(f"Could not write {self.store.path} ({exc}); nothing was changed.") from None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _summary(endpoint: Endpoint) -> dict[str, Any]:
    return {e.name: {"model": e.model, "traffic_percentage": e.traffic_percentage} for e in endpoint.served}
