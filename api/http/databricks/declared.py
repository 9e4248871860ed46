"""Serving endpoints declared in a config file: its `[[endpoints]]` tables → endpoint requests.

Owns: the shape of those tables, checked here (the served models are checked when the
server has them, `ServingEndpoints.check_declared`). Raises ConfigError naming the file, the
table and the key. Imports api.http.databricks and api.http.platform.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from api.http.databricks.endpoints import CreateEndpointRequest, EndpointConfigInput, RouteInput, ServedEntityInput, TrafficConfigInput
from api.http.platform.config import ConfigError

ENDPOINT_KEYS = ("name", "served", "description", "tags")
SERVED_KEYS = ("model", "name", "version", "traffic_percentage", "traffic")


def endpoint_specs(tables: Any, source: str = "config") -> list[CreateEndpointRequest]:
    """The `[[endpoints]]` tables of a config file → CreateEndpointRequest,
    checked for shape here (the served models are checked when the server has them):

        [[endpoints]]
        name = "chat-ab"
        served = [
          { model = "tiny-a", name = "a", traffic_percentage = 70 },
          { model = "tiny-b", name = "b", traffic_percentage = 30 },
        ]

    `model` is a served model's name; `name` (default: the model's) is the served entity's
    name within the endpoint, what responses report in `served-model-name`; `traffic` is
    accepted for `traffic_percentage`. One served entity needs no percentage; several need one
    each, whole numbers summing to 100."""
    if not isinstance(tables, list):
        raise ConfigError(f"{source}: endpoints must be an array of tables ([[endpoints]])")
    return [_endpoint(table, f"{source}: endpoints[{i}]") for i, table in enumerate(tables)]


def _table(value: Any, where: str, known: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a table")
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown}; known: {list(known)}")
    return value


def _endpoint(table: Any, where: str) -> CreateEndpointRequest:
    table = _table(table, where, ENDPOINT_KEYS)
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where} needs a name")
    where = f"{where} ({name!r})"
    served = table.get("served")
    if not isinstance(served, list) or not served:
        raise ConfigError(f"{where} needs served = [{{ model = \"...\" }}, ...]")
    entities, routes = [], []
    for j, item in enumerate(served):
        entity, route = _served(item, f"{where}: served[{j}]")
        entities.append(entity)
        routes += [route] if route is not None else []
    if routes and len(routes) != len(entities):
        raise ConfigError(f"{where}: give every served entity a traffic_percentage, or none (one entity only)")
    if len(entities) > 1 and not routes:
        raise ConfigError(f"{where}: several served entities need a traffic_percentage each")
    if routes and sum(r.traffic_percentage for r in routes) != 100:
        raise ConfigError(f"{where}: traffic percentages sum to {sum(r.traffic_percentage for r in routes)}, not 100")
    description = table.get("description")
    tags = table.get("tags")
    if description is not None and not isinstance(description, str):
        raise ConfigError(f"{where}: description must be a string")
    if tags is not None and (not isinstance(tags, Mapping) or not all(isinstance(v, str) for v in tags.values())):
        raise ConfigError(f"{where}: tags must be a table of strings")
    config = EndpointConfigInput(served_entities=entities, traffic_config=TrafficConfigInput(routes=routes) if routes else None)
    return CreateEndpointRequest(
        name=name, config=config, description=description,
        tags=[{"key": k, "value": v} for k, v in tags.items()] if tags else None,
    )


def _served(item: Any, where: str) -> tuple[ServedEntityInput, RouteInput | None]:
    """One `served` entry: the entity, and its traffic route when it gives a percentage."""
    item = _table(item, where, SERVED_KEYS)
    model = item.get("model")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"{where} needs model = \"<a served model's name>\"")
    entity = item.get("name", model)
    version = item.get("version")
    if not isinstance(entity, str) or (version is not None and not isinstance(version, (str, int))):
        raise ConfigError(f"{where}.name and .version must be strings")
    if "traffic" in item and "traffic_percentage" in item:
        raise ConfigError(f"{where} gives both traffic and traffic_percentage")
    percent = item.get("traffic_percentage", item.get("traffic"))
    route = None
    if percent is not None:
        if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
            raise ConfigError(f"{where}.traffic_percentage must be a whole number from 0 to 100")
        route = RouteInput(served_entity_name=entity, traffic_percentage=percent)
    return ServedEntityInput(entity_name=model, name=entity, entity_version=None if version is None else str(version)), route
