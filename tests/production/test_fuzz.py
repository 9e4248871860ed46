"""Fuzz every route with bodies generated (hypothesis) from the server's own /openapi.json.

At least 2,000 requests: schema-valid bodies, valid bodies with one field broken, arbitrary
JSON, and raw bytes, to every POST route the document lists (plus GETs with random path
parameters). The server must never answer 5xx (nor put a server_error event in a stream),
and afterwards it is idle and serves an ordinary request.

Hypothesis generates the bodies up front (a nested `@given` collecting examples), and the test
then sends them 16 at a time: per-example servers would cost minutes. Left out: the
state-changing admin API under /api/2.0/ (it persists endpoints to disk) and PUT/DELETE.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any
from urllib.parse import quote

import httpx
import msgspec
import trio
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from tests.conftest import start_server, tiny_config
from tests.production.conftest import serves_normally, wait_idle

NUM_BODIES = 2200
SERVED = "tiny"
# Deterministic by default (a CI failure reproduces); set a seed to explore further.
SEED = int(os.environ["SWITCHYARD_FUZZ_SEED"]) if os.environ.get("SWITCHYARD_FUZZ_SEED") else None
CONCURRENCY = 16
EXCLUDED_PREFIXES = ("/api/2.0/",)

KEYS = ["role", "content", "type", "text", "name", "id", "arguments", "call_id", "output", "tool_calls",
        "function", "json_schema", "schema", "strict", "format", "image_url", "url", "input_text", "message"]  # fmt: skip
WORDS = ["user", "assistant", "system", "developer", "tool", "message", "input_text", "output_text", "text",
         "function", "function_call", "json_schema", "json_object", "auto", "none", "required", "Hi", ""]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(WORDS),
)
any_json = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


class SchemaStrategies:
    """JSON Schema (the subset msgspec emits) → hypothesis strategies for valid instances."""

    def __init__(self, components: dict[str, Any]) -> None:
        self.components = components
        self._refs: dict[str, st.SearchStrategy[Any]] = {}

    def build(self, schema: dict[str, Any]) -> st.SearchStrategy[Any]:
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            if name not in self._refs:
                self._refs[name] = st.deferred(lambda: self.build(self.components[name]))
            return self._refs[name]
        if "anyOf" in schema:
            return st.one_of([self.build(s) for s in schema["anyOf"]])
        if "enum" in schema:
            return st.sampled_from(schema["enum"])
        if "const" in schema:
            return st.just(schema["const"])
        kind = schema.get("type")
        if kind is None:
            return any_json
        if isinstance(kind, list):
            return st.one_of([self.build({**schema, "type": k}) for k in kind])
        return getattr(self, f"_{kind}")(schema)

    def _null(self, schema: dict) -> st.SearchStrategy[Any]:
        return st.none()

    def _boolean(self, schema: dict) -> st.SearchStrategy[Any]:
        return st.booleans()

    def _integer(self, schema: dict) -> st.SearchStrategy[Any]:
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if schema.get("exclusiveMinimum") is not None:
            lo = schema["exclusiveMinimum"] + 1
        if schema.get("exclusiveMaximum") is not None:
            hi = schema["exclusiveMaximum"] - 1
        anywhere = st.integers(min_value=lo, max_value=hi)
        # Small values most of the time: they pass the cross-field checks and reach the engine.
        small_lo, small_hi = max(lo, -3) if lo is not None else -3, min(hi, 24) if hi is not None else 24
        if small_lo > small_hi:
            return anywhere
        return st.one_of(st.integers(small_lo, small_hi), st.integers(small_lo, small_hi), anywhere)

    def _number(self, schema: dict) -> st.SearchStrategy[Any]:
        return st.floats(
            min_value=schema.get("minimum", schema.get("exclusiveMinimum")),
            max_value=schema.get("maximum", schema.get("exclusiveMaximum")),
            exclude_min="exclusiveMinimum" in schema,
            exclude_max="exclusiveMaximum" in schema,
            allow_nan=False,
            allow_infinity=False,
        )

    def _string(self, schema: dict) -> st.SearchStrategy[Any]:
        return st.text(min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 60), 60)) | st.sampled_from(WORDS)

    def _array(self, schema: dict) -> st.SearchStrategy[Any]:
        items = self.build(schema.get("items", {}))
        lo = schema.get("minItems", 0)
        return st.lists(items, min_size=lo, max_size=max(lo, min(schema.get("maxItems", 4), 4)))

    def _object(self, schema: dict) -> st.SearchStrategy[Any]:
        props = schema.get("properties")
        if not props:
            extra = schema.get("additionalProperties")
            values = self.build(extra) if isinstance(extra, dict) else any_json
            return st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), values, max_size=4)
        required = set(schema.get("required", ()))
        fields = {name: self.build(sub) for name, sub in props.items()}
        if "model" in fields:  # mostly the served model, so bodies get past the 404
            fields["model"] = st.one_of(st.just(SERVED), st.just(SERVED), fields["model"])

        @st.composite
        def obj(draw: st.DrawFn) -> dict[str, Any]:
            out = {}
            for name, strategy in fields.items():
                if name in required or draw(st.integers(0, 3)) == 0:  # optional fields: 1 in 4
                    out[name] = draw(strategy)
            return out

        return obj()


def body_strategy(schema: st.SearchStrategy[Any] | None) -> st.SearchStrategy[bytes]:
    def broken(valid: dict) -> st.SearchStrategy[dict]:
        if not isinstance(valid, dict) or not valid:
            return st.just(valid)
        return st.tuples(st.sampled_from(sorted(valid)), any_json).map(lambda kv: {**valid, kv[0]: kv[1]})

    encode = msgspec.json.encode
    choices = [
        any_json.map(encode),
        st.binary(max_size=64),
        st.sampled_from([b"", b"{", b'{"model": ', b"[]", b"null", b'{"messages": [}', b"\xff\xfe"]),
    ]
    if schema is not None:
        choices = [schema.map(encode), schema.map(encode), schema.flatmap(broken).map(encode), *choices]
    return st.one_of(choices)


def generate_requests(doc: dict[str, Any]) -> list[tuple[str, str, bytes | None]]:
    schemas = SchemaStrategies(doc["components"]["schemas"])
    targets: list[st.SearchStrategy[tuple[str, str, bytes | None]]] = []
    for path, ops in doc["paths"].items():
        if path.startswith(EXCLUDED_PREFIXES):
            continue
        params = [p for op in ops.values() for p in op.get("parameters", ())]
        concrete = st.just(path)
        if params:
            concrete = st.text(min_size=1, max_size=30).map(lambda v, path=path, params=params: _fill(path, params, v))
        for method, op in ops.items():
            if method == "get":
                targets.append(st.tuples(st.just("GET"), concrete, st.none()))
            elif method == "post":
                body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
                strategy = body_strategy(schemas.build(body) if body else None)
                weight = 6 if body else 1  # most effort where there is a schema to break
                targets += [st.tuples(st.just("POST"), concrete, strategy)] * weight

    collected: list[tuple[str, str, bytes | None]] = []

    @seed(SEED if SEED is not None else 0)
    @settings(
        max_examples=NUM_BODIES,
        derandomize=SEED is None,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.one_of(targets))
    def collect(request: tuple[str, str, bytes | None]) -> None:
        collected.append(request)

    collect()
    return collected


def _fill(path: str, params: list[dict], value: str) -> str:
    for p in params:
        path = path.replace("{" + p["name"] + "}", quote(value, safe=""))
    return path


async def test_fuzz_every_route_from_the_openapi_document(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    # A short context bounds every generation a valid body can ask for.
    config = tiny_config(tiny_model_dir, max_model_len=48, max_num_batched_tokens=64)
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, config)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60, limits=httpx.Limits(max_connections=CONCURRENCY + 2)) as http:
            doc = (await http.get("/openapi.json")).json()
            requests = generate_requests(doc)
            assert len(requests) >= 2000
            assert {p for _, p, _ in requests} >= {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"}
            random.Random(0).shuffle(requests)
            failures: list[str] = []
            statuses: dict[int, int] = {}
            queue = iter(requests)

            async def worker() -> None:
                for method, path, body in queue:
                    if method == "GET":
                        r = await http.get(path)
                        text = r.text
                    else:
                        headers = {"content-type": "application/json"}
                        async with http.stream("POST", path, content=body, headers=headers) as r:
                            text = (await r.aread()).decode(errors="replace")
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                    server_error_event = r.headers.get("content-type", "").startswith("text/event-stream") and '"server_error"' in text
                    if r.status_code >= 500 or server_error_event:
                        failures.append(f"{method} {path} {body!r:.300} -> {r.status_code} {text[:300]}")

            with trio.fail_after(240):
                async with trio.open_nursery() as workers:
                    for _ in range(CONCURRENCY):
                        workers.start_soon(worker)
            assert not failures, f"{len(failures)} of {len(requests)} failed; first: " + "\n".join(failures[:5])
            assert sum(statuses.values()) == len(requests)
            assert statuses.get(200, 0) >= 50, statuses  # valid bodies got through, not only errors
        await wait_idle(srv.runtime)
        await serves_normally(srv.base_url)
        srv.stop.set()


def test_openapi_document_describes_the_routes() -> None:
    from api.app import create_app
    from api.openapi import build_document
    from api.schemas import ChatCompletionRequest
    from runtime.registry import ModelRegistry

    app = create_app(ModelRegistry([]))
    doc = build_document(app)
    assert doc["openapi"].startswith("3.1")
    served = {rule.rule for rule in app.url_map.iter_rules() if rule.endpoint != "static"}
    assert {p.replace("{model_id}", "<path:model_id>") for p in doc["paths"]} >= {"/v1/chat/completions", "/health", "/metrics"}
    assert len(doc["paths"]) == len(served)
    op = doc["paths"]["/v1/chat/completions"]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    component = doc["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    expected = msgspec.json.schema_components([ChatCompletionRequest], ref_template="#/components/schemas/{name}")[1]
    assert component == expected["ChatCompletionRequest"]
    assert doc["paths"]["/v1/models/{model_id}"]["get"]["parameters"][0]["name"] == "model_id"
    assert "429" in op["responses"] and "ErrorResponse" in doc["components"]["schemas"]
    json.dumps(doc)  # plain JSON all the way down
