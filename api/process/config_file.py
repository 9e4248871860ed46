"""The config file (`--config`): its tables, checked, and the served models they make.

Owns: reading the TOML file, refusing anything it does not know with an error naming the file
and the entry (a misspelt table must not be ignored), and `model_configs`: the served models,
from the file's [[models]] tables or from the command line. Four top-level entries, all
optional:

    [[models]]      one served model each: model (path or built-in name), name, task (chat,
                    completions, embeddings), dtype, kv_cache_gib, num_kv_blocks, max_pending,
                    ... (MODEL_KEYS); each table overrides the CLI's settings. Without any
                    [[models]], the CLI's model (and the default embedding model) are served.
    [[endpoints]]   serving endpoints over those models, with traffic splits
                    (api.http.databricks.declared.endpoint_specs); applied at every start.
    [platform]      API keys (by environment variable name: api_keys_env), rate limits,
                    state_dir (api.http.platform.config.file_settings). The environment and the
                    CLI flags override it; keys from all three add up.
    [cluster]       serve-ray's settings (api/cluster/settings.py).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from typing import Any

import msgspec

from api.http.databricks.declared import endpoint_specs
from api.http.platform import config as platform_config
from runtime.config import SPEC_DECODING_MODES, RuntimeConfig, stretch_value
from runtime.generation_defaults import MODES as GENERATION_MODES
from runtime.reasoning import PARSERS
from runtime.tool_formats import PARSERS as TOOL_PARSERS

MODEL_KEYS = {
    "model", "served_name", "task", "device", "dtype", "kv_cache_gib", "num_kv_blocks", "block_size", "max_num_seqs",
    "max_num_batched_tokens", "max_model_len", "max_pending", "max_pending_tokens", "num_threads", "batch_invariant",
    "model_impl", "compile", "quantization", "cuda_graphs", "step_stretch", "step_deadline", "async_scheduling", "engine_process", "spec_decoding", "num_spec_tokens",
    "draft_model",
    "limit_images_per_prompt", "stream_interval", "max_prompt_chunks", "burst_tokens",
    "reasoning_parser", "reasoning_budgets", "tool_call_parser", "chat_template", "generation_config", "memory_utilization",
}


CONFIG_TABLES = ("models", "endpoints", "platform", "cluster")  # [cluster]: serve-ray only (api/cluster/settings.py)


@dataclass
class ConfigFile:
    path: str
    models: list[dict[str, Any]] = field(default_factory=list)
    endpoints: list[Any] = field(default_factory=list)  # api.http.databricks.endpoints.CreateEndpointRequest
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
            f"{path}: unknown top-level entries {unknown}; a config file has [[models]], [[endpoints]], [platform] and [cluster] "
            "(API keys and rate limits go in [platform])"
        )
    tables = document.get("models", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise SystemExit(f"{path}: models must be an array of tables ([[models]])")
    for i, table in enumerate(tables):
        _check_model_table(path, i, table)
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


def _check_model_table(path: str, i: int, table: dict[str, Any]) -> None:
    """One [[models]] table's keys and values; SystemExit naming the file and the entry."""
    unknown_keys = set(table) - MODEL_KEYS - {"name"}
    if unknown_keys:
        raise SystemExit(f"{path}: models[{i}] has unknown keys {sorted(unknown_keys)}")
    if table.get("task", "chat") not in ("chat", "completions", "embeddings"):
        raise SystemExit(f"{path}: models[{i}].task must be chat, completions or embeddings")
    if table.get("reasoning_parser", "auto") not in PARSERS:
        raise SystemExit(f"{path}: models[{i}].reasoning_parser must be one of {', '.join(PARSERS)}")
    if table.get("tool_call_parser", "auto") not in TOOL_PARSERS:
        raise SystemExit(f"{path}: models[{i}].tool_call_parser must be one of {', '.join(TOOL_PARSERS)}")
    if table.get("generation_config", "auto") not in GENERATION_MODES:
        raise SystemExit(f"{path}: models[{i}].generation_config must be one of {', '.join(GENERATION_MODES)}")
    if table.get("spec_decoding", "off") not in SPEC_DECODING_MODES:
        raise SystemExit(f"{path}: models[{i}].spec_decoding must be one of {', '.join(SPEC_DECODING_MODES)}")
    for key, least, left_out in (("stream_interval", 1, ""), ("max_prompt_chunks", 1, " (leave it out for the runner's choice)"), ("burst_tokens", 0, " (0: never)")):
        value = table.get(key, least)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise SystemExit(f"{path}: models[{i}].{key} must be a whole number of at least {least}{left_out}")
    for key, most in (("memory_utilization", 1.0), ("kv_cache_gib", float("inf"))):
        value = table.get(key, 1.0)
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= most:
            raise SystemExit(f"{path}: models[{i}].{key} must be a number above 0{' and at most 1' if most == 1 else ''}")
    try:
        stretch_value(table.get("step_stretch", "auto"))
    except ValueError:
        raise SystemExit(f"{path}: models[{i}].step_stretch must be a finite number above 1, \"auto\" or \"off\"") from None
    budgets = table.get("reasoning_budgets", {})
    if not isinstance(budgets, dict) or not all(k in ("low", "medium", "high") and isinstance(v, int) and v >= 0 for k, v in budgets.items()):
        raise SystemExit(f"{path}: models[{i}].reasoning_budgets must be a table of low, medium, high = tokens")


def model_configs(base: RuntimeConfig, config: str | ConfigFile | None, with_embeddings: bool) -> list[RuntimeConfig]:
    """Every served model: the [[models]] of a config file (each table overrides the CLI's
    settings), else the CLI's model plus the default embedding model."""
    if isinstance(config, str):
        config = read_config_file(config)
    if config is None or not config.models:
        configs = [base]
        if with_embeddings:
            configs.append(msgspec.structs.replace(base, model=None, served_name=None, task="embeddings", dtype="float32"))
        return memory_shares(configs)
    configs = []
    for table in config.models:
        fields = {k: v for k, v in table.items() if k in MODEL_KEYS}
        if "step_stretch" in fields:  # as the flag gives it: "off" None, a whole number a float (the fingerprint's repr)
            fields["step_stretch"] = stretch_value(fields["step_stretch"])
        if "name" in table:
            fields["served_name"] = table["name"]
        configs.append(msgspec.structs.replace(base, **fields))
    return memory_shares(configs)


def memory_shares(configs: list[RuntimeConfig]) -> list[RuntimeConfig]:
    """Several generation models in one process split the memory: each one that sizes its KV
    cache from memory takes an equal part of the share it would have alone."""
    sized = [c.kv_cache_gib is None and c.num_kv_blocks is None and c.task != "embeddings" for c in configs]
    if sum(sized) < 2:
        return configs
    return [msgspec.structs.replace(c, memory_parts=sum(sized)) if s else c for c, s in zip(configs, sized, strict=True)]
