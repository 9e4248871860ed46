"""LoRA adapters (PEFT directories) served beside their base model, chosen by the request's `model`.

Owns what the flags name (`--enable-lora`, `--lora-modules NAME=DIR`, `--max-loras`,
`--max-lora-rank`, vLLM's), what an adapter directory holds (`AdapterConfig` from PEFT's
`adapter_config.json`: rank, scaling, which projections it adapts) and `lora_error`, the
start-up check in one line: an adapter the native forward would serve wrong is refused (DoRA,
`modules_to_save`, trainable tokens or resized embeddings, per-module ranks, biases, a regex
or a module outside the Llama family's seven projections, a rank over the limit). Prefix-cache
isolation keys on `salt`. Imports nothing but the standard library.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The projections a native family's layer runs, as PEFT names them.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True, slots=True)
class AdapterConfig:
    name: str  # what requests send as `model`
    path: Path
    rank: int
    scaling: float  # lora_alpha / r, or / sqrt(r) with rsLoRA
    targets: frozenset[str]  # of TARGETS


@dataclass(frozen=True, slots=True)
class LoraSettings:
    """What --enable-lora gives the runner: the adapters named at start, and the limits
    (--max-loras adapters of rank up to --max-lora-rank in a step's slots at once, filled on
    first use; --max-cpu-loras read ones kept in host memory, None: every one named at start)."""

    adapters: tuple[AdapterConfig, ...]
    max_loras: int
    max_rank: int
    max_cpu_loras: int | None = None


def parse_module(text: str) -> tuple[str, str]:
    """`NAME=DIR` → (name, dir); ValueError naming the form."""
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise ValueError(f"--lora-modules {text!r}: expected NAME=DIR")
    return name.strip(), path.strip()


def read_adapter(name: str, path: str, max_rank: int) -> AdapterConfig:
    """The adapter at `path`, or ValueError in one line saying why it is not served."""
    where = Path(path).expanduser()
    try:
        config = json.loads((where / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: no readable adapter_config.json ({type(exc).__name__})") from None
    if not (where / WEIGHTS).is_file():
        raise ValueError(f"{path}: no {WEIGHTS} (PEFT's safetensors weights)")
    why = _unserved(config, max_rank)
    if why:
        raise ValueError(f"{path}: {why}")
    rank, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
    scaling = alpha / rank**0.5 if config.get("use_rslora") else alpha / rank
    return AdapterConfig(name=name, path=where, rank=rank, scaling=scaling, targets=_targets(config["target_modules"]))


def _unserved(config: dict[str, Any], max_rank: int) -> str | None:
    if config.get("peft_type", "LORA") != "LORA":
        return f"peft_type {config.get('peft_type')!r} (LoRA only)"
    if config.get("use_dora"):
        return "DoRA (use_dora) is not served"
    if config.get("modules_to_save") or config.get("trainable_token_indices"):
        return "modules_to_save / trainable_token_indices (whole modules or embeddings trained beside the adapter) are not served"
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        return "per-module ranks (rank_pattern / alpha_pattern) are not served"
    if config.get("bias", "none") != "none":
        return f"bias {config.get('bias')!r} (trained biases) is not served"
    if config.get("layers_to_transform") is not None or config.get("fan_in_fan_out"):
        return "layers_to_transform / fan_in_fan_out are not served"
    rank = config.get("r")
    if not isinstance(rank, int) or not 0 < rank <= max_rank:
        return f"rank r={rank!r} is over --max-lora-rank {max_rank}"
    modules = config.get("target_modules")
    if modules != "all-linear" and (not isinstance(modules, list) or not modules or _targets(modules) - set(TARGETS)):
        return f"target_modules {modules!r}: the native families adapt {list(TARGETS)} (or all-linear)"
    return None


def _targets(modules: Any) -> frozenset[str]:
    """The projections adapted: names as given, or the last part of a module path PEFT wrote
    (`model.layers.0.self_attn.q_proj`; the layers it leaves out are read from the weights)."""
    return frozenset(TARGETS) if modules == "all-linear" else frozenset(str(m).rsplit(".", 1)[-1] for m in modules)


def salt(adapter: str | None) -> int | None:
    """What a request's prefix-cache chain starts from: None for the base model, else a
    number of the adapter's name (two adapters never share KV)."""
    if adapter is None:
        return None
    return int.from_bytes(hashlib.blake2b(adapter.encode(), digest_size=8).digest(), "little")


def lora_error(
    modules: dict[str, str], enabled: bool, max_loras: int, max_rank: int, served_name: str, drafter: str = "off", lora_dir: str | None = None,
    max_cpu_loras: int | None = None,
) -> str | None:  # fmt: skip
    """Why these flags cannot serve, in one line naming the flag; None when they can.
    `drafter`: --spec-decoding (the n-gram pool keys on the adapter; a draft model does not)."""
    if (modules or lora_dir) and not enabled:
        return f"{'--lora-modules' if modules else '--lora-dir'} needs --enable-lora"
    if lora_dir and not Path(lora_dir).expanduser().is_dir():
        return f"--lora-dir {lora_dir!r}: not a directory"
    if enabled and drafter == "draft":
        return "--enable-lora: a draft model is not served beside adapters (it drafts for the base alone); give --spec-decoding ngram, auto or off"
    if max_cpu_loras is not None and max_cpu_loras < max_loras:
        return f"--max-cpu-loras {max_cpu_loras} is under --max-loras {max_loras} (a slot's adapter is read from host memory)"
    if served_name in modules:
        return f"--lora-modules {served_name!r}: the base model is served under that name"
    for name, path in modules.items():
        try:
            read_adapter(name, path, max_rank)
        except ValueError as exc:
            return f"--lora-modules {name}={exc}"
    return None
