"""The TOML config file: [[models]], [[endpoints]] (traffic splits) and [platform] (API keys by
environment variable name, rate limits, state dir); anything else is refused, never ignored."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from api.http.platform.config import ConfigError, PlatformConfig
from api.process.config_file import read_config_file
from api.process.main import load
from tests.support.servers import Server, tiny_config

KEY = "sk-from-the-environment-0123"


def write(tmp_path: Path, text: str, name: str = "switchyard.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def document(model_dir: Path, state_dir: Path, split: tuple[int, int] = (70, 30)) -> str:
    return f"""
[[models]]
name = "tiny-a"
model = "{model_dir}"
compile = false
dtype = "float32"
num_kv_blocks = 64
block_size = 4

[[models]]
name = "tiny-b"
model = "{model_dir}"
compile = false
task = "completions"
dtype = "float32"
num_kv_blocks = 64
block_size = 4

[[endpoints]]
name = "chat-ab"
description = "A/B test"
tags = {{ team = "search" }}
served = [
  {{ model = "tiny-a", name = "a", traffic_percentage = {split[0]} }},
  {{ model = "tiny-b", name = "b", traffic = {split[1]} }},
]

[[endpoints]]
name = "stable"
served = [{{ model = "tiny-a" }}]

[platform]
api_keys_env = ["SY_TEST_KEY"]
requests_per_minute = 600
tokens_per_minute = 100000
state_dir = "{state_dir}"
"""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("SWITCHYARD_API_KEYS", "SWITCHYARD_RATE_LIMIT_RPM", "SWITCHYARD_RATE_LIMIT_TPM", "SWITCHYARD_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SY_TEST_KEY", KEY)
    return monkeypatch


def test_config_file_models_endpoints_and_platform(tiny_model_dir: Path, tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, document(tiny_model_dir, tmp_path / "state"))
    launch = load(["serve", "--config", path, "--port", "0"])
    configs, platform = launch.configs, launch.platform
    assert [(c.served_name, c.task, c.num_kv_blocks) for c in configs] == [("tiny-a", "chat", 64), ("tiny-b", "completions", 64)]
    assert platform.api_keys == (KEY,) and KEY not in repr(platform)
    assert (platform.requests_per_minute, platform.tokens_per_minute, platform.state_dir) == (600, 100000, str(tmp_path / "state"))
    ab, stable = platform.endpoints
    assert ab.name == "chat-ab" and ab.description == "A/B test" and ab.tags == [{"key": "team", "value": "search"}]
    assert [(e.entity_name, e.name) for e in ab.config.served_entities] == [("tiny-a", "a"), ("tiny-b", "b")]
    assert [(r.served_entity_name, r.traffic_percentage) for r in ab.config.traffic_config.routes] == [("a", 70), ("b", 30)]
    assert stable.config.traffic_config is None and stable.config.served_entities[0].entity_name == "tiny-a"

    # The environment overrides the file, the CLI overrides both; keys add up across all three.
    clean_env.setenv("SWITCHYARD_RATE_LIMIT_RPM", "7")
    clean_env.setenv("SWITCHYARD_API_KEYS", "env-key")
    platform = load(["serve", "--config", path, "--rate-limit-tpm", "9", "--api-key", "cli-key"]).platform
    assert platform.api_keys == (KEY, "env-key", "cli-key")
    assert (platform.requests_per_minute, platform.tokens_per_minute) == (7, 9)

    # Without [[models]] the CLI's model is served, and the file still sets the platform.
    clean_env.delenv("SWITCHYARD_API_KEYS")
    path = write(tmp_path, '[platform]\napi_keys_env = ["SY_TEST_KEY"]\n', "platform-only.toml")
    launch = load(["serve", "--config", path, "--model", str(tiny_model_dir), "--no-embeddings"])
    configs, platform = launch.configs, launch.platform
    assert [c.model for c in configs] == [str(tiny_model_dir)] and platform.api_keys == (KEY,) and platform.endpoints == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # What the reviewer's probe tried: keys at the top level. Refused, naming it.
        ('api_keys = ["sk-x"]\n[[models]]\nname = "a"\n', "unknown top-level entries ['api_keys']"),
        ('[server]\nport = 1\n', "unknown top-level entries ['server']"),
        ('[[endpoint]]\nname = "x"\n', "unknown top-level entries ['endpoint']"),
        ('[platform]\napi_key = "sk-x"\n', "[platform] has unknown keys ['api_key']"),
        ('[platform]\napi_keys_env = ["SY_TEST_UNSET_VARIABLE"]\n', "api_keys_env names SY_TEST_UNSET_VARIABLE, which is not set"),
        ('[platform]\nrequests_per_minute = 0\n', "requests_per_minute must be a whole number of at least 1"),
        ('[platform]\ntokens_per_minute = "lots"\n', "tokens_per_minute must be a whole number"),
        ('[[endpoints]]\nserved = [{ model = "a" }]\n', "endpoints[0] needs a name"),
        ('[[endpoints]]\nname = "e"\n', "needs served = "),
        ('[[endpoints]]\nname = "e"\nserved = [{ model = "a", weight = 5 }]\n', "served[0] has unknown keys ['weight']"),
        ('[[endpoints]]\nname = "e"\nserved = [{ model = "a" }, { model = "b" }]\n', "several served entities need a traffic_percentage"),
        ('[[endpoints]]\nname = "e"\nserved = [{ model = "a", traffic = 60 }, { model = "b", traffic = 30 }]\n', "sum to 90, not 100"),
        ('[[endpoints]]\nname = "e"\nserved = [{ model = "a", traffic = 70 }, { model = "b" }]\n', "give every served entity a traffic_percentage"),
        ('[[endpoints]]\nname = "e"\nserved = [{ model = "a", traffic = 101 }]\n', "from 0 to 100"),
        ('[[endpoints]]\nname = "e"\nrouting = "x"\nserved = [{ model = "a" }]\n', "endpoints[0] has unknown keys ['routing']"),
        ('[[models]]\nname = "a"\n[[endpoints]]\nname = "e"\nserved = [{ model = "zz" }]\n', "serves 'zz', which no [[models]] table names"),
        ('[[models]]\nname = "a"\ncolour = "red"\n', "models[0] has unknown keys ['colour']"),
        ('[[models]]\nname = "a"\nspec_decoding = "eagle"\n', "models[0].spec_decoding must be one of off, ngram, draft, auto"),
        ("models = 3\n", "models must be an array of tables"),
        ("[[models]\n", "not valid TOML"),
    ],
)
def test_config_file_errors_are_refused_by_name(tmp_path: Path, clean_env: pytest.MonkeyPatch, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SystemExit) as info:
        read_config_file(path)
    assert message in str(info.value) and path in str(info.value)


def test_literal_keys_in_the_file_work_but_are_warned_about(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    import structlog

    with structlog.testing.capture_logs() as logs:
        file = read_config_file(write(tmp_path, '[platform]\napi_keys = ["sk-literal-key"]\napi_keys_env = ["SY_TEST_KEY"]\n'))
    assert file.platform["api_keys"] == (KEY, "sk-literal-key")
    assert any(e["event"] == "api_keys_in_config_file" for e in logs) and "sk-literal-key" not in repr(logs)


@asynccontextmanager
async def file_server(path: str, tiny_model_dir: Path) -> AsyncIterator[Server]:
    """A server as `switchyard serve --config path` builds it (models, platform, endpoints)."""
    from actors.build import build_engine
    from api.process.server import serve_runtime

    launch = load(["serve", "--config", path, "--port", "0", "--num-threads", "1"])
    configs, platform = launch.configs, launch.platform
    stop = trio.Event()
    runtimes: list[object] = []

    def factory(cfg):  # type: ignore[no-untyped-def]
        runtimes.append(build_engine(cfg))
        return runtimes[-1]

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve_runtime, configs[0], factory, stop.wait, configs[1:], platform))
        try:
            yield Server(base_url=binds[0], runtime=runtimes[0], config=configs[0], stop=stop, runtimes=runtimes)
        finally:
            stop.set()


async def test_declared_endpoints_are_served_and_reapplied_at_each_start(tiny_model_dir: Path, tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    path = write(tmp_path, document(tiny_model_dir, state))
    auth = {"Authorization": f"Bearer {KEY}"}
    async with file_server(path, tiny_model_dir) as srv, httpx.AsyncClient(base_url=srv.base_url, timeout=60) as http:
        assert (await http.get("/api/2.0/serving-endpoints/chat-ab")).status_code == 401  # the key from SY_TEST_KEY
        http.headers.update(auth)
        got = (await http.get("/api/2.0/serving-endpoints/chat-ab")).json()
        routes = {r["served_model_name"]: r["traffic_percentage"] for r in got["config"]["traffic_config"]["routes"]}
        assert routes == {"a": 70, "b": 30} and got["config"]["config_version"] == 1 and got["description"] == "A/B test"
        seen = set()
        for _ in range(20):
            r = await http.post("/serving-endpoints/chat-ab/invocations", json={"prompt": "Hi", "max_tokens": 1})
            assert r.status_code == 200, r.text
            seen.add((r.headers["served-model-name"], r.json()["model"]))
        assert seen <= {("a", "tiny-a"), ("b", "tiny-b")} and ("a", "tiny-a") in seen
        r = await http.post("/serving-endpoints/stable/invocations", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
        assert r.status_code == 200 and r.headers["served-model-name"] == "tiny-a"
        first_id = got["id"]
    assert (state / "serving_endpoints.sqlite3").is_file()

    # Same file: nothing changes. Edited file: the stored endpoint follows it (one new version).
    async with file_server(path, tiny_model_dir) as srv, httpx.AsyncClient(base_url=srv.base_url, headers=auth, timeout=60) as http:
        got = (await http.get("/api/2.0/serving-endpoints/chat-ab")).json()
        assert got["config"]["config_version"] == 1 and got["id"] == first_id
    write(tmp_path, document(tiny_model_dir, state, split=(0, 100)))
    async with file_server(path, tiny_model_dir) as srv, httpx.AsyncClient(base_url=srv.base_url, headers=auth, timeout=60) as http:
        got = (await http.get("/api/2.0/serving-endpoints/chat-ab")).json()
        assert got["config"]["config_version"] == 2 and got["id"] == first_id
        for _ in range(5):
            r = await http.post("/serving-endpoints/chat-ab/invocations", json={"prompt": "Hi", "max_tokens": 1})
            assert r.headers["served-model-name"] == "b"


async def test_a_declared_endpoint_on_no_served_model_stops_the_server(tiny_model_dir: Path, tmp_path: Path) -> None:
    from api.http.databricks.declared import endpoint_specs
    from api.http.databricks.endpoints import ServingEndpoints
    from api.http.databricks.store import EndpointStore
    from api.process.server import serve_runtime
    from runtime.registry import ModelRegistry

    specs = endpoint_specs([{"name": "e", "served": [{"model": "not-served"}]}])
    platform = PlatformConfig(state_dir=str(tmp_path), endpoints=tuple(specs))
    with pytest.raises(ConfigError, match=r"\[\[endpoints\]\] 'e': 'not-served' is not a model this server serves"):
        await serve_runtime(tiny_config(tiny_model_dir), None, trio.sleep_forever, (), platform)  # before it listens
    assert not (tmp_path / "serving_endpoints.sqlite3").exists()
    from types import SimpleNamespace

    models = ModelRegistry([SimpleNamespace(served_name="m", task="generate", created=0)])  # type: ignore[list-item]
    endpoints = ServingEndpoints(models, EndpointStore(tmp_path / "x.sqlite3"))
    with pytest.raises(ConfigError, match="a served model already has that name"):
        endpoints.check_declared(endpoint_specs([{"name": "m", "served": [{"model": "m"}]}]))
    with pytest.raises(ConfigError, match="declared twice"):
        endpoints.check_declared(endpoint_specs([{"name": "e", "served": [{"model": "m"}]}] * 2))
