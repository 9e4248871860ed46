"""The `switchyard` command: CLI → RuntimeConfig → trio.run(Runtime + Hypercorn).

Owns: argument parsing, logging set-up, hosting the app on Hypercorn in the runtime's nursery,
and the shutdown order on SIGINT/SIGTERM: stop admitting, drain in-flight requests up to the
deadline, abort the rest, then stop the actors.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tomllib
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

import msgspec
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from api import platform_config
from runtime.config import RuntimeConfig
from runtime.logging import configure_logging, get_logger

log = get_logger("serve")


_CLI_EXTRAS: dict[str, object] = {}  # CLI flags that are not per-model settings


def parse_args(argv: list[str] | None = None) -> RuntimeConfig:
    parser = argparse.ArgumentParser(prog="switchyard", description="Switchyard LLM serving runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="serve a model over HTTP")
    p.add_argument("--model", default=None, help="a local Hugging Face causal-LM directory (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--served-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-pending", type=int, default=512, help="admitted, unfinished requests; past this a 429")
    p.add_argument("--max-pending-tokens", type=int, default=None, help="estimated prompt + max_tokens of admitted requests; past this a 429")
    p.add_argument("--step-deadline", type=float, default=60.0, help="/health turns 503 while one step runs longer than this (s)")
    p.add_argument("--num-threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="on SIGTERM, seconds in-flight requests get to finish")
    p.add_argument("--log-level", default="info")
    p.add_argument("--config", default=None, help="a TOML file listing served models ([[models]] tables); see README")
    p.add_argument("--no-embeddings", action="store_true", help="do not also serve the default embedding model")
    p.add_argument("--log-prompts", action="store_true", help="log request bodies and generated text (off: never logged)")
    platform_config.add_arguments(p)
    args = parser.parse_args(argv)
    _CLI_EXTRAS.update(config=args.config, no_embeddings=args.no_embeddings, platform=platform_config.from_args(args))
    return RuntimeConfig(
        model=args.model,
        served_name=args.served_name,
        host=args.host,
        port=args.port,
        device=args.device,
        dtype=args.dtype,
        kv_cache_gib=args.kv_cache_gib,
        num_kv_blocks=args.num_kv_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        max_pending=args.max_pending,
        max_pending_tokens=args.max_pending_tokens,
        step_deadline=args.step_deadline,
        log_prompts=args.log_prompts,
        num_threads=args.num_threads,
        drain_timeout=args.drain_timeout,
        log_level=args.log_level,
    )


async def serve_runtime(
    config: RuntimeConfig,
    runtime_factory: Callable[[RuntimeConfig], object] | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    extra_models: Sequence[RuntimeConfig] = (),
    platform: object = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the runtime and the HTTP server until `shutdown_trigger` returns, then drain."""
    from api.app import create_app
    from runtime.engine import build_runtime

    from runtime.registry import ModelRegistry

    factory = runtime_factory or build_runtime
    models = ModelRegistry([factory(c) for c in (config, *extra_models)])  # type: ignore[misc]
    app = create_app(models, platform)
    hconfig = HypercornConfig()
    hconfig.bind = [f"{config.host}:{config.port}"]
    hconfig.accesslog = None
    # Our own drain (below) waits for in-flight requests before hypercorn is told to stop, so
    # its graceful period only has to flush the last bytes; a long one made every idle
    # keep-alive connection hold shutdown up for the whole period.
    hconfig.graceful_timeout = 2.0
    hconfig.keep_alive_timeout = 75

    async with trio.open_nursery() as nursery:
        # Listen for signals from the start, so a SIGTERM during model loading is queued (and
        # acted on once up) rather than killing the process mid-conversion.
        shutdown, force = trio.Event(), trio.Event()
        watcher: trio.CancelScope = await nursery.start(_watch_for_shutdown, shutdown_trigger, shutdown, force)
        await nursery.start(models.run)
        stop_http = trio.Event()
        async with trio.open_nursery() as http:
            binds = await http.start(partial(serve, app, hconfig, shutdown_trigger=stop_http.wait))
            log.info("listening", binds=binds)
            task_status.started(binds)
            await shutdown.wait()
            # 1. stop admitting (new requests get 503), 2. let in-flight ones finish until the
            # drain deadline (a second signal cuts it short), 3. abort the rest: each gets a
            # clean error (an SSE error event, or a 503 body).
            log.info("shutting_down", live_requests=_live(models), drain_timeout=config.drain_timeout)
            with trio.CancelScope() as drain_scope:
                http.start_soon(_cancel_when, force, drain_scope)
                await models.drain(config.drain_timeout)
            aborted = _live(models)
            await models.drain(0)
            log.info("drained", aborted=aborted)
            # 4. hypercorn closes its listeners and idle connections, and waits (up to its
            # graceful_timeout) for open responses, the aborted ones' error events included.
            stop_http.set()
            force.set()  # ends the _cancel_when helper
        # 5. only now stop the actors: nothing can reach them any more.
        models.stop()
        watcher.cancel()
        log.info("stopped")


def _live(models: object) -> int:
    return sum(len(runtime.requests) for runtime in models)  # type: ignore[attr-defined]


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
    "max_num_batched_tokens", "max_model_len", "max_pending", "max_pending_tokens", "num_threads",
}


def model_configs(base: RuntimeConfig, config_path: str | None, with_embeddings: bool) -> list[RuntimeConfig]:
    """Every served model: the [[models]] of a TOML file (each table overrides the CLI's
    settings), else the CLI's model plus the default embedding model."""
    if config_path is None:
        configs = [base]
        if with_embeddings:
            configs.append(msgspec.structs.replace(base, model=None, served_name=None, task="embeddings", dtype="float32"))
        return configs
    with open(config_path, "rb") as f:
        document = tomllib.load(f)
    tables = document.get("models") or []
    if not tables:
        raise SystemExit(f"{config_path}: no [[models]] table")
    configs = []
    for i, table in enumerate(tables):
        unknown = set(table) - MODEL_KEYS - {"name"}
        if unknown:
            raise SystemExit(f"{config_path}: models[{i}] has unknown keys {sorted(unknown)}")
        if table.get("task", "chat") not in ("chat", "completions", "embeddings"):
            raise SystemExit(f"{config_path}: models[{i}].task must be chat, completions or embeddings")
        fields = {k: v for k, v in table.items() if k in MODEL_KEYS}
        if "name" in table:
            fields["served_name"] = table["name"]
        configs.append(msgspec.structs.replace(base, **fields))
    return configs


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    configure_logging(config.log_level)
    configs = model_configs(config, _CLI_EXTRAS.get("config"), not _CLI_EXTRAS.get("no_embeddings", False))
    try:
        trio.run(partial(serve_runtime, configs[0], extra_models=configs[1:], platform=_CLI_EXTRAS.get("platform")))
    except KeyboardInterrupt:
        pass
    # Clean stop: every response is sent and the device threads are joined. Skip interpreter
    # finalization, which with torch and models loaded takes seconds (measured 3-8 s here)
    # and would eat into an orchestrator's grace period after the drain deadline.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
