"""The `switchyard` command: CLI → RuntimeConfig → trio.run(Runtime + Hypercorn).

Owns: argument parsing (bad input: one line naming the flag, exit 2, before any model loads;
the socket is bound first), the TOML config file, logging set-up, hosting the app on Hypercorn in
the runtime's nursery, and the shutdown order on SIGINT/SIGTERM: stop admitting, drain
in-flight requests up to the deadline, abort the rest, then stop the actors.

The config file (`--config`) has three top-level entries, all optional; anything else in it is
refused with an error naming it (a misspelt table must not be ignored):

    [[models]]      one served model each: model (path or built-in name), name, task (chat,
                    completions, embeddings), dtype, kv_cache_gib, num_kv_blocks, max_pending,
                    ... (MODEL_KEYS); each table overrides the CLI's settings. Without any
                    [[models]], the CLI's model (and the default embedding model) are served.
    [[endpoints]]   serving endpoints over those models, with traffic splits
                    (api.databricks.declared.endpoint_specs); applied at every start.
    [platform]      API keys (by environment variable name: api_keys_env), rate limits,
                    state_dir (api.platform.config.file_settings). The environment and the CLI
                    flags override it; keys from all three add up.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import tomllib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NoReturn

import msgspec
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from api.app import build_app
from api.cluster.cli import serve_ray
from api.databricks.declared import endpoint_specs
from api.platform import config as platform_config
from runtime.config import RuntimeConfig
from runtime.engine import Runtime
from runtime.logging import configure_logging, get_logger
from runtime.memory import bound_native_caches
from runtime.model_store import model_error
from runtime.registry import ModelRegistry

log = get_logger("serve")
DEFAULTS = RuntimeConfig()  # one place for every default: the CLI shows the same ones


_CLI_EXTRAS: dict[str, Any] = {}  # CLI flags that are not per-model settings


def parse_args(argv: list[str] | None = None) -> RuntimeConfig:
    parser = argparse.ArgumentParser(prog="switchyard", description="Switchyard LLM serving runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="serve a model over HTTP")
    _add_serve_arguments(p)
    ray = sub.add_parser("serve-ray", help="serve the same API from replicas on Ray Serve (needs the ray extra)")
    _add_serve_arguments(ray)
    _add_cluster_arguments(ray)
    args = parser.parse_args(argv)
    _CLI_EXTRAS.update(config=args.config, no_embeddings=args.no_embeddings, args=args)
    return _runtime_config(args)


def _add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """serve-ray's own flags; each overrides the config file's [cluster] table (api/cluster/settings.py)."""
    p.add_argument("--address", default=None, help="a running Ray cluster to join (default: start a local Ray instance)")
    p.add_argument("--replicas", type=int, default=None, help="model replicas (default 1)")
    p.add_argument("--ingress-replicas", type=int, default=None, help="HTTP ingress replicas (default 1)")
    p.add_argument("--replica-cpus", type=float, default=None, help="Ray CPUs reserved per model replica (default 1)")
    p.add_argument("--router", choices=["prefix", "pow2"], default=None, help="prefix-aware routing (default) or Ray's power of two choices")
    p.add_argument(
        "--topology", choices=["auto", "direct", "relay"], default=None,
        help="direct: Ray's proxy calls the replicas (one hop fewer; no prefix routing); relay: through the ingress; "
        "auto (default): direct for pow2 or one replica",
    )  # fmt: skip


def _add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="a local Hugging Face causal-LM directory (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--served-name", default=None)
    p.add_argument("--host", default=DEFAULTS.host)
    p.add_argument("--port", type=int, default=DEFAULTS.port)
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--kv-cache-gib", type=float, default=DEFAULTS.kv_cache_gib)
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--block-size", type=int, default=DEFAULTS.block_size)
    p.add_argument("--max-num-seqs", type=int, default=DEFAULTS.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=DEFAULTS.max_num_batched_tokens, help="tokens per step: decodes plus prefill chunks (%(default)s; 512 measured 5-9%% faster than 256 at c=32 here; a step is then at most ~150 ms on this CPU)")
    p.add_argument("--step-stretch", type=_stretch, default=DEFAULTS.step_stretch, help="while requests stream, a step carries prompt chunks worth at most (this - 1) x its decodes' own time, measured as the engine runs, so a stream's gap between chunks stays within this x a decode step (%(default)s; 'off': the token budget alone)")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-pending", type=int, default=DEFAULTS.max_pending, help="admitted, unfinished requests; past this a 429")
    p.add_argument("--max-pending-tokens", type=int, default=None, help="estimated prompt + max_tokens of admitted requests; past this a 429")
    p.add_argument("--step-deadline", type=float, default=DEFAULTS.step_deadline, help="/health turns 503 while one step runs longer than this (s)")
    p.add_argument("--num-threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--drain-timeout", type=float, default=DEFAULTS.drain_timeout, help="on SIGTERM, seconds in-flight requests get to finish")
    p.add_argument("--log-level", default="info")
    p.add_argument("--config", default=None, help="a TOML file: [[models]], [[endpoints]] and [platform] tables; see README")
    p.add_argument("--no-embeddings", action="store_true", help="do not also serve the default embedding model")
    p.add_argument("--log-prompts", action="store_true", help="log request bodies and generated text (off: never logged)")
    p.add_argument(
        "--batch-invariant",
        action="store_true",
        help="a seeded request gives the same text alone or in any batch, bf16 included (matmuls in fixed 32-row blocks; slower at low concurrency)",
    )
    p.add_argument("--model-impl", default=DEFAULTS.model_impl, choices=["auto", "native", "transformers"], help="model code: native (Llama, Mistral, Qwen2, Qwen3), transformers (any causal LM), auto (native when supported)")
    p.add_argument("--compile", action="store_true", help="torch.compile the native path at start-up: one graph for a single stream's decode step (1.4x with int4 here) (about 2 minutes the first time on 2 cores; inductor's disk cache after)")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_const", const=False, default=None, help="on a GPU, run decode steps eager instead of replaying one captured CUDA graph per batch and key-length bucket (native path)")
    p.add_argument("--quantization", default=None, choices=["int8", "int4"], help="quantized linears on the native path: weight-only kernels for steps of up to 4 rows (faster single streams), an int8 GEMM with per-row quantized activations past that (faster prompts and wide batches)")
    platform_config.add_arguments(p)


def _stretch(text: str) -> float | None:
    if text == "off":
        return None
    value = float(text)
    if value <= 1.0:
        raise argparse.ArgumentTypeError("must be above 1 (a step is at least its decodes), or 'off'")
    return value


def _runtime_config(args: argparse.Namespace) -> RuntimeConfig:
    # Every per-model flag is named as its RuntimeConfig field (task comes from the config file).
    return RuntimeConfig(**{name: getattr(args, name) for name in RuntimeConfig.__struct_fields__ if hasattr(args, name)})


async def serve_runtime(
    config: RuntimeConfig,
    runtime_factory: Callable[[RuntimeConfig], Runtime] | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    extra_models: Sequence[RuntimeConfig] = (),
    platform: platform_config.PlatformConfig | None = None,
    sockets: Sockets | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the runtime and the HTTP server until `shutdown_trigger` returns, then drain.
    `sockets`: the listening sockets (`listen(config)`); None: bound here, before any model
    is loaded, so a taken port fails at once."""
    hconfig = _hypercorn_config(config)
    sockets = sockets if sockets is not None else listen(config, hconfig)
    models, app = build_app([config, *extra_models], platform, runtime_factory)

    async with trio.open_nursery() as nursery:
        # Listen for signals from the start, so a SIGTERM during model loading is queued (and
        # acted on once up) rather than killing the process mid-conversion.
        shutdown, force = trio.Event(), trio.Event()
        watcher: trio.CancelScope = await nursery.start(_watch_for_shutdown, shutdown_trigger, shutdown, force)
        await nursery.start(models.run)
        stop_http = trio.Event()
        async with trio.open_nursery() as http:
            binds = await http.start(partial(worker_serve, wrap_app(app, hconfig.wsgi_max_body_size, "asgi"), hconfig, sockets=sockets, shutdown_trigger=stop_http.wait))
            log.info("listening", binds=binds)
            task_status.started(binds)
            await shutdown.wait()
            # 1. stop admitting (new requests get 503), 2. let in-flight ones finish until the
            # drain deadline (a second signal cuts it short), 3. abort the rest: each gets a
            # clean error (an SSE error event, or a 503 body).
            log.info("shutting_down", live_requests=_live(models), drain_timeout=config.drain_timeout)
            aborted = 0
            with trio.CancelScope() as drain_scope:
                http.start_soon(_cancel_when, force, drain_scope)
                aborted = await models.drain(config.drain_timeout)  # aborts those past the deadline
            aborted += await models.drain(0)  # and those a second signal left (none otherwise)
            log.info("drained", aborted=aborted)
            # 4. hypercorn closes its listeners and idle connections, and waits (up to its
            # graceful_timeout) for open responses, the aborted ones' error events included.
            stop_http.set()
            force.set()  # ends the _cancel_when helper
        # 5. only now stop the actors: nothing can reach them any more.
        models.stop()
        watcher.cancel()
        log.info("stopped")


def _hypercorn_config(config: RuntimeConfig) -> HypercornConfig:
    hconfig = HypercornConfig()
    hconfig.bind = [f"{config.host}:{config.port}"]
    hconfig.accesslog = None
    # Our own drain (serve_runtime) waits for in-flight requests before hypercorn is told to
    # stop, so its graceful period only has to flush the last bytes; a long one made every idle
    # keep-alive connection hold shutdown up for the whole period.
    hconfig.graceful_timeout = 2.0
    hconfig.keep_alive_timeout = 75
    return hconfig


def listen(config: RuntimeConfig, hconfig: HypercornConfig | None = None) -> Sockets:
    """The listening sockets for --host and --port; `BindError` naming the flag when the
    address cannot be had (in use, or not this machine's)."""
    hconfig = hconfig or _hypercorn_config(config)
    try:
        sockets = hconfig.create_sockets()
    except OSError as exc:
        reason = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be listened on: {exc.strerror or exc}"
        flag = "--port" if exc.errno == errno.EADDRINUSE else "--host"
        raise BindError(f"{flag}: {config.host}:{config.port} {reason}") from None
    for sock in sockets.insecure_sockets:
        sock.listen(hconfig.backlog)
    return sockets


class BindError(Exception):
    pass


def _live(models: ModelRegistry) -> int:
    return sum(len(runtime.requests) for runtime in models)


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _watch_for_shutdown(
    trigger: Callable[[], Awaitable[None]] | None,
    shutdown: trio.Event,
    force: trio.Event,
    task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
) -> None:
    """First SIGINT/SIGTERM (or `trigger` returning): drain. A second one: stop waiting."""
    with trio.CancelScope() as scope:
        if trigger is not None:
            task_status.started(scope)
            await trigger()
            shutdown.set()
            return
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            task_status.started(scope)
            async for signum in signals:
                if shutdown.is_set():
                    log.warning("forced_shutdown", signal=signal.Signals(signum).name)
                    force.set()
                    return
                log.info("signal_received", signal=signal.Signals(signum).name)
                shutdown.set()


MODEL_KEYS = {
    "model", "served_name", "task", "device", "dtype", "kv_cache_gib", "num_kv_blocks", "block_size", "max_num_seqs",
    "max_num_batched_tokens", "max_model_len", "max_pending", "max_pending_tokens", "num_threads", "batch_invariant",
    "model_impl", "compile", "quantization", "cuda_graphs", "step_stretch", "step_deadline",
}


CONFIG_TABLES = ("models", "endpoints", "platform", "cluster")  # [cluster]: serve-ray only (api/cluster/settings.py)


@dataclass
class ConfigFile:
    path: str
    models: list[dict[str, Any]] = field(default_factory=list)
    endpoints: list[Any] = field(default_factory=list)  # api.databricks.endpoints.CreateEndpointRequest
    platform: dict[str, Any] = field(default_factory=dict)  # keyword settings for PlatformConfig
    cluster: dict[str, Any] = field(default_factory=dict)  # the [cluster] table, read by serve-ray


def read_config_file(path: str, environ: Any = None) -> ConfigFile:
    """Parse and check a config file; SystemExit naming the file and the entry on any error."""
    try:
        with open(path, "rb") as f:
            document = tomllib.load(f)
    except OSError as exc:
        raise SystemExit(f"--config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SystemExit(f"{path}: not valid TOML: {exc}") from None
    unknown = [name for name in document if name not in CONFIG_TABLES]
    if unknown:
        raise SystemExit(
            f"{path}: unknown top-level entries {unknown}; a config file has [[models]], [[endpoints]] and [platform] "
            "(API keys and rate limits go in [platform])"
        )
    tables = document.get("models", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise SystemExit(f"{path}: models must be an array of tables ([[models]])")
    for i, table in enumerate(tables):
        unknown_keys = set(table) - MODEL_KEYS - {"name"}
        if unknown_keys:
            raise SystemExit(f"{path}: models[{i}] has unknown keys {sorted(unknown_keys)}")
        if table.get("task", "chat") not in ("chat", "completions", "embeddings"):
            raise SystemExit(f"{path}: models[{i}].task must be chat, completions or embeddings")
    try:
        endpoints = endpoint_specs(document.get("endpoints", []), path)
        settings = platform_config.file_settings(document.get("platform", {}), environ, path)
    except platform_config.ConfigError as exc:
        raise SystemExit(str(exc)) from None
    names = [t.get("name") for t in tables]
    if tables and all(isinstance(n, str) for n in names):  # every served name is known now
        for spec in endpoints:
            for entity in (spec.config.served_entities if spec.config is not None else None) or ():
                if entity.entity_name not in names:
                    raise SystemExit(f"{path}: endpoint {spec.name!r} serves {entity.entity_name!r}, which no [[models]] table names ({names})")
    cluster = document.get("cluster", {})
    if not isinstance(cluster, dict):
        raise SystemExit(f"{path}: cluster must be a table ([cluster])")
    return ConfigFile(path=path, models=tables, endpoints=endpoints, platform=settings, cluster=cluster)


def model_configs(base: RuntimeConfig, config: str | ConfigFile | None, with_embeddings: bool) -> list[RuntimeConfig]:
    """Every served model: the [[models]] of a config file (each table overrides the CLI's
    settings), else the CLI's model plus the default embedding model."""
    if isinstance(config, str):
        config = read_config_file(config)
    if config is None or not config.models:
        configs = [base]
        if with_embeddings:
            configs.append(msgspec.structs.replace(base, model=None, served_name=None, task="embeddings", dtype="float32"))
        return configs
    configs = []
    for table in config.models:
        fields = {k: v for k, v in table.items() if k in MODEL_KEYS}
        if "name" in table:
            fields["served_name"] = table["name"]
        configs.append(msgspec.structs.replace(base, **fields))
    return configs


def load(argv: list[str] | None = None) -> tuple[list[RuntimeConfig], platform_config.PlatformConfig]:
    """The command line (and its config file) → the served models and the platform settings."""
    config = parse_args(argv)
    configure_logging(config.log_level)
    path = _CLI_EXTRAS.get("config")
    file = read_config_file(path) if isinstance(path, str) else None
    _CLI_EXTRAS["cluster_table"] = file.cluster if file else {}
    configs = model_configs(config, file, not _CLI_EXTRAS.get("no_embeddings", False))
    for i, model in enumerate(c.model for c in configs):
        error = model_error(model)
        if error:  # checked now: loading the other models first would take a while
            raise SystemExit(f"{file.path}: models[{i}].model: {error}" if file and file.models else f"switchyard: {error}")
    try:
        platform = platform_config.from_args(
            _CLI_EXTRAS["args"], file.platform if file else None, file.endpoints if file else ()
        )
    except ValueError as exc:
        raise SystemExit(f"switchyard: {exc}") from None
    return configs, platform


def main(argv: list[str] | None = None) -> None:
    bound_native_caches()  # before anything loads torch (runtime/memory.py)
    try:
        configs, platform = load(argv)
        args = _CLI_EXTRAS["args"]
        if args.command == "serve-ray":  # Ray's proxy listens; the replicas build the stack
            serve_ray(configs, platform, args, _CLI_EXTRAS.get("cluster_table", {}))
            return
        sockets = listen(configs[0])  # before any model loads: a taken port fails at once
    except SystemExit as exc:
        if isinstance(exc.code, str):
            usage_error(exc.code)
        raise
    except BindError as exc:
        usage_error(f"switchyard: {exc}")
    try:
        trio.run(partial(serve_runtime, configs[0], extra_models=configs[1:], platform=platform, sockets=sockets))
    except KeyboardInterrupt:
        pass
    except platform_config.ConfigError as exc:  # e.g. an [[endpoints]] table naming no served model
        raise SystemExit(f"switchyard: {exc}") from None
    # Clean stop: every response is sent and the device threads are joined. Skip interpreter
    # finalization, which with torch and models loaded takes seconds (measured 3-8 s here)
    # and would eat into an orchestrator's grace period after the drain deadline.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def usage_error(line: str) -> NoReturn:
    """Bad command-line input: one line naming the flag (or file entry), exit status 2, as
    argparse's own usage errors; never a traceback."""
    print(line, file=sys.stderr)
    sys.stderr.flush()
    raise SystemExit(2)


if __name__ == "__main__":
    main()
