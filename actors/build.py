"""`build_engine(config)`: an `Engine` for one `RuntimeConfig`, with its tokenizer and runner.

Owns: resolving the model (a local directory or the embedded default of its task), loading its
tokenizer, collecting its EOS ids, and choosing the runner (the embedding runner, or the torch
runner with the config's device, dtype, KV cache and model path), and for a vision-language
model its processor (actors/multimodal.py), which the tokenizer actor expands images with. The process layer calls it;
the model's weights load later, on the device thread, when the engine runs.
"""

from __future__ import annotations

from pathlib import Path

from actors.engine import Engine
from actors.engine_link import spawn_error
from actors.runners.base import Runner
from runtime.adapters import LoraSettings, read_adapter
from runtime.chat_templates import apply_template
from runtime.config import RuntimeConfig
from runtime.errors import ModelRefused
from runtime.generation_defaults import read_defaults


def build_engine(config: RuntimeConfig) -> Engine:
    """An Engine for `config.model` (the embedded default of its task when None)."""
    from transformers import AutoTokenizer

    from runtime.model_store import resolve_model

    name, path = resolve_model(config.model, task=config.task)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if config.task == "embeddings":
        from actors.runners.embedding_runner import EmbeddingRunner

        runner: Runner = EmbeddingRunner(path, device=config.device, dtype=config.dtype, num_threads=config.num_threads)
        return Engine(config, runner, tokenizer, config.served_name or name, frozenset())

    from transformers import GenerationConfig

    from actors.runners.runner_config import RunnerConfig
    from actors.runners.torch_runner import TorchRunner
    from actors.runners.vision.families import family_of as vision_family

    apply_template(config.chat_template, tokenizer)
    eos: set[int] = set()
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    try:
        generation = GenerationConfig.from_pretrained(path)
        ids = generation.eos_token_id
        eos.update([ids] if isinstance(ids, int) else (ids or []))
    except OSError:
        pass
    images = None
    family = vision_family(path)
    if family is not None:  # a vision-language model: its processor expands image parts
        from actors.multimodal import ImagePrompts, load_processor

        processor = load_processor(path, family)
        tokenizer = processor.tokenizer
        apply_template(config.chat_template, processor, tokenizer)
        images = ImagePrompts(processor, family)
    refused = spawn_error(config) if config.engine_process else None
    if refused:
        raise ModelRefused(refused)
    runner = TorchRunner(path, RunnerConfig.of(config, _draft_model(config), _lora(config)))
    defaults = read_defaults(path, config.generation_config)
    return Engine(config, runner, tokenizer, config.served_name or name, frozenset(eos), images=images, sampling_defaults=defaults)


def _draft_model(config: RuntimeConfig) -> Path | None:
    """--spec-decoding draft (or auto with a draft model): the draft model's directory, checked
    against the target as the command line checks it (again here: the embedded default may
    have been converted since)."""
    if config.drafter() != "draft":
        return None
    from actors.runners.native.families import ARCHITECTURES
    from runtime.draft_models import draft_error
    from runtime.model_store import resolve_model

    error = draft_error(config, ARCHITECTURES)
    if error:
        raise ValueError(error)
    return resolve_model(config.draft_model)[1]


def _lora(config: RuntimeConfig) -> LoraSettings | None:
    """--enable-lora: the adapters named at start, read, and the slots' limits."""
    if not config.enable_lora:
        return None
    adapters = tuple(read_adapter(name, where, config.max_lora_rank) for name, where in config.lora_modules.items())
    return LoraSettings(adapters, config.max_loras, config.max_lora_rank, config.max_cpu_loras)
