"""The `switchyard` command: CLI → RuntimeConfig → trio.run(Runtime + Hypercorn).

Owns: argument parsing, logging set-up, hosting the app on Hypercorn in the runtime's nursery,
and the shutdown order on SIGINT/SIGTERM: stop admitting, drain in-flight requests up to the
deadline, abort the rest, then stop the actors.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Awaitable, Callable

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from runtime.config import RuntimeConfig
from runtime.logging import configure_logging, get_logger

log = get_logger("serve")


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
    p.add_argument("--max-pending", type=int, default=512)
    p.add_argument("--num-threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
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
        num_threads=args.num_threads,
        drain_timeout=args.drain_timeout,
        log_level=args.log_level,
    )


async def serve_runtime(
    config: RuntimeConfig,
    runtime_factory: Callable[[RuntimeConfig], object] | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the runtime and the HTTP server until `shutdown_trigger` returns, then drain."""
    from api.app import create_app
    from runtime.engine import build_runtime

    from runtime.registry import ModelRegistry

    runtime = (runtime_factory or build_runtime)(config)
    models = ModelRegistry([runtime])  # type: ignore[list-item]
    app = create_app(models)
    hconfig = HypercornConfig()
    hconfig.bind = [f"{config.host}:{config.port}"]
    hconfig.accesslog = None
    hconfig.graceful_timeout = config.drain_timeout + 5
    hconfig.keep_alive_timeout = 75

    async with trio.open_nursery() as nursery:
        await nursery.start(models.run)
        stop = trio.Event()

        async def trigger() -> None:
            await stop.wait()

        binds = await nursery.start(lambda task_status: serve(app, hconfig, shutdown_trigger=trigger, task_status=task_status))
        log.info("listening", binds=binds)
        task_status.started(binds)
        if shutdown_trigger is None:
            await _wait_for_signal()
        else:
            await shutdown_trigger()
        log.info("shutting_down")
        await models.drain(config.drain_timeout)
        stop.set()  # hypercorn closes its listeners and waits for open responses to end
        await trio.sleep(0.05)
        models.stop()


async def _wait_for_signal() -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            return


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    configure_logging(config.log_level)
    try:
        trio.run(serve_runtime, config)
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
