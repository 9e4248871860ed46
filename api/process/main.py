"""`switchyard`: the command's entry point. Parses the command line and the config file,
then runs `serve` (this process, api/process/server.py) or `serve-ray` (the Ray deployment,
api/cluster).

Owns: the order of start-up checks (flags, config file, each model's path, the platform
settings, the listening socket: all before any model loads), the one-line usage errors (exit
2, never a traceback), and leaving the process quickly once everything has stopped.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import partial
from typing import Any, NoReturn

import msgspec
import trio

from actors.runners.native.families import ARCHITECTURES as NATIVE_ARCHITECTURES
from api.cluster.cli import serve_ray
from api.http.platform import config as platform_config
from api.process.config_file import model_configs, read_config_file
from api.process.flags import CommandLine, parse_args
from api.process.front_ends import Parent
from api.process.server import BindError, listen, serve_runtime
from runtime.adapters import lora_error
from runtime.chat_templates import template_error
from runtime.checkpoints import checkpoint_error
from runtime.config import RuntimeConfig
from runtime.draft_models import draft_error
from runtime.errors import ModelRefused
from runtime.logging import configure_logging
from runtime.memory import bound_native_caches
from runtime.model_store import architecture_error, model_error


@dataclass(frozen=True)
class Launch:
    """What the command line and its config file ask for, checked before any model loads."""

    command: CommandLine
    configs: list[RuntimeConfig]  # the served models, the first one's host and port listened on
    platform: platform_config.PlatformConfig
    cluster_table: dict[str, Any]  # the config file's [cluster] table (serve-ray's settings)


def load(argv: list[str] | None = None) -> Launch:
    """The command line (and its config file) → the served models and the platform settings."""
    command = parse_args(argv)
    configure_logging(command.config.log_level)
    path = command.args.config
    file = read_config_file(path) if isinstance(path, str) else None
    configs = model_configs(command.config, file, not command.args.no_embeddings)
    if command.config.api_servers > 1:  # the front ends share each model's engine process
        configs = [msgspec.structs.replace(c, engine_process=True) for c in configs]
    for i, config in enumerate(configs):
        model, task, generates = config.model, config.task, config.task != "embeddings"
        key, error = "model", model_error(model) or architecture_error(model, task) or (checkpoint_error(model, config.max_model_len, native=NATIVE_ARCHITECTURES) if generates else None)
        if not error and generates:
            key, error = "chat_template", template_error(config.chat_template, "chat_template" if file and file.models else "--chat-template")
        if error:  # checked now: loading the other models first would take a while
            raise SystemExit(f"{file.path}: models[{i}].{key}: {error}" if file and file.models else f"switchyard: {error}")
    for i, config in enumerate(configs):
        error = draft_error(config, NATIVE_ARCHITECTURES) or lora_error(
            config.lora_modules, config.enable_lora, config.max_loras, config.max_lora_rank, config.served_name or "",
            config.spec_decoding,  # auto drafts n-grams beside adapters, never with the draft model
            config.lora_dir,
            config.max_cpu_loras,
        )
        if error:
            raise SystemExit(f"{file.path}: models[{i}]: {error}" if file and file.models else f"switchyard: {error}")
    try:
        platform = platform_config.from_args(command.args, file.platform if file else None, file.endpoints if file else ())
    except ValueError as exc:
        raise SystemExit(f"switchyard: {exc}") from None
    return Launch(command=command, configs=configs, platform=platform, cluster_table=file.cluster if file else {})


def main(argv: list[str] | None = None) -> None:
    bound_native_caches()  # before anything loads torch (runtime/memory.py)
    try:
        launch = load(argv)
        if launch.command.command == "serve-ray":  # Ray's proxy listens; the replicas build the stack
            if launch.configs[0].api_servers > 1:
                raise SystemExit("switchyard: --api-servers is for serve; serve-ray's replicas each run one front end")
            serve_ray(launch.configs, launch.platform, launch.command.args, launch.cluster_table)
            return
        sockets = listen(launch.configs[0])  # before any model loads: a taken port fails at once
    except SystemExit as exc:
        if isinstance(exc.code, str):
            usage_error(exc.code)
        raise
    except BindError as exc:
        usage_error(f"switchyard: {exc}")
    configs, platform, parent = launch.configs, launch.platform, None
    if configs[0].api_servers > 1:
        parent = Parent(launch.platform, sockets, configs[0].api_servers, sys.argv[1:] if argv is None else argv)
        platform = parent.platform
    try:
        trio.run(partial(serve_runtime, configs[0], extra_models=configs[1:], platform=platform, sockets=sockets, freeze_heap=True, companions=parent))
    except KeyboardInterrupt:
        pass
    except platform_config.ConfigError as exc:  # e.g. an [[endpoints]] table naming no served model
        raise SystemExit(f"switchyard: {exc}") from None
    except BaseExceptionGroup as group:  # a model found at load not to be served right
        refused = group.subgroup(ModelRefused)
        if refused is None:
            raise
        usage_error(f"switchyard: {_leaf(refused)}")
    if parent is not None and parent.failed:
        print(f"switchyard: an engine process died ({parent.failed}); the front ends drained and stopped", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    # Clean stop: every response is sent and the device threads are joined. Skip interpreter
    # finalization, which with torch and models loaded takes seconds and would eat into an
    # orchestrator's grace period after the drain deadline.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _leaf(group: BaseException) -> BaseException:
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group


def usage_error(line: str) -> NoReturn:
    """Bad command-line input: one line naming the flag (or file entry), exit status 2, as
    argparse's own usage errors; never a traceback."""
    print(line, file=sys.stderr)
    sys.stderr.flush()
    raise SystemExit(2)


if __name__ == "__main__":
    main()
