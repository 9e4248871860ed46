"""The two ways a step's forward runs, behind one interface, and the choice between them.

Owns: `ModelPath` (what the runner needs from a model: its cache shapes, the step metadata,
logits for the kept rows), `TransformersPath` (any transformers causal LM, our paged attention
plugged in through the attention interface) and `choose()`, which picks the native path for
the architectures it supports unless `model_impl` says otherwise.
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch

from actors.runners import attention_check, paged_attention
from actors.runners.invariant import module_fixed_block_linear
from actors.runners.native import config as native_config
from actors.runners.native import families, shipped
from actors.runners.native.path import NativePath
from actors.runners.runner_config import RunnerConfig
from actors.runners.vision.families import family_of
from actors.runners.vision.path import VisionPath
from runtime.checkpoints import checkpoint_error, fp8
from runtime.errors import ModelRefused
from runtime.logging import get_logger

log = get_logger("runner")

class ModelPath(Protocol):
    impl: str  # "native" | "transformers" | "transformers+vision": logged at start-up, shown in /v1/models
    takes_images: bool  # a vision-language model: the runner calls with_images before each forward
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int

    def build_step(
        self, seqs: list[tuple[int, int]], tables: list[list[int]], block_size: int, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]
    ) -> tuple[Any, torch.Tensor]: ...

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, step: Any, keep: torch.Tensor, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor]
    ) -> torch.Tensor: ...

    def with_images(self, seqs: Any, requests: Any, positions: torch.Tensor) -> torch.Tensor: ...


class TransformersPath:
    """transformers' own modules, eager, with `switchyard_paged` attention."""

    impl = "transformers"
    takes_images = False

    def __init__(self, model_dir: Path, dtype: torch.dtype, device: torch.device, batch_invariant: bool | None) -> None:
        from transformers import AutoModelForCausalLM

        paged_attention.register()
        try:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=paged_attention.ATTN_NAME)
        except (KeyError, ValueError) as exc:  # its modules take no attention but their own
            if paged_attention.ATTN_NAME not in str(exc):
                raise
            raise attention_check.refused(str(model_dir), exc) from exc
        self.model = model.to(device).eval()
        self.batch_invariant = batch_invariant
        if batch_invariant:
            for module in self.model.modules():
                if isinstance(module, torch.nn.Linear):
                    module.forward = partial(module_fixed_block_linear, module)
        config = model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.num_layers = text.num_hidden_layers
        self.num_kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        self.head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.max_position_embeddings = getattr(text, "max_position_embeddings", 2048)

    def build_step(self, seqs, tables, block_size, k_cache, v_cache):
        return paged_attention.build_step(seqs, tables, block_size, k_cache, v_cache, per_sequence_decode=bool(self.batch_invariant))

    def forward(self, input_ids, positions, step, keep, k_cache, v_cache):
        out = self.model(input_ids=input_ids[None, :], position_ids=positions[None, :], use_cache=False, paged_step=step, logits_to_keep=keep)
        return out.logits[0]

    def with_images(self, seqs, requests, positions):
        return positions


QUANTIZATIONS = ("none", "int8", "int4", "shipped")


def _check_quantization(quantization: str | None, model_dir: Path, model_impl: str, device: torch.device, batch_invariant: bool | None) -> None:
    if quantization in (None, "none"):
        return
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, not {quantization!r}")
    if quantization == shipped.SCHEME and not shipped.ships_blocks(model_dir):
        raise ValueError(f"--quantization shipped: {model_dir} ships no quantized weights (the embedded default model does)")
    if model_impl == "transformers":
        raise ValueError("--quantization runs on the native path only, not with --model-impl transformers")
    if device.type != "cpu":
        raise ValueError(f"--quantization uses aten's CPU kernels; not on {device}")
    if batch_invariant and quantization != shipped.SCHEME:
        # The int8 GEMM's rounding depends on the rows beside a row (its activations' scales do not, its blocking does).
        raise ValueError(f"--quantization {quantization} and --batch-invariant cannot be combined")


def served_quantization(quantization: str | None, model_dir: Path, dtype_explicit: bool, device: torch.device, batch_invariant: bool | None) -> tuple[str | None, str | None]:
    """What the native path serves: the scheme asked for; by default (None) the checkpoint's own
    quantized blocks where it ships them and nothing else was asked for, else the dense weights.
    Also why a checkpoint that ships quantized weights is served dense (None when it is not)."""
    if quantization is not None:
        return (None if quantization == "none" else quantization), ("--quantization none" if quantization == "none" and shipped.ships_blocks(model_dir) else None)
    if not shipped.ships_blocks(model_dir):
        return None, None
    if dtype_explicit:
        return None, "--dtype asks for the dense upcast"
    if device.type != "cpu":
        return None, f"the quantized kernels are aten's CPU kernels, not {device.type}'s"
    return shipped.SCHEME, None


def choose(model_dir: Path, config: RunnerConfig, dtype: torch.dtype, device: torch.device) -> ModelPath:
    """The native path when asked for (`config.model_impl`) or (auto) when it supports the model;
    else transformers. Compile, quantization, graphs and adapters apply to the native path only
    (transformers' modules stay eager and dense); quantization with a model the native path
    cannot run is an error. `config.quantization` None: the checkpoint's own quantized blocks
    where it ships them (`served_quantization`), unless a dtype was asked for (the dense upcast)."""
    model_impl, quantization, batch_invariant, max_len, lora = config.model_impl, config.quantization, config.batch_invariant, config.max_model_len, config.lora
    if model_impl not in ("auto", "native", "transformers"):
        raise ValueError(f"model_impl must be auto, native or transformers, not {model_impl!r}")
    _check_quantization(quantization, model_dir, model_impl, device, batch_invariant)
    wrong = checkpoint_error(str(model_dir), max_len, native=families.ARCHITECTURES)  # the command line said so already; any other start too
    if wrong:
        raise ValueError(wrong)
    started = time.perf_counter()
    family = family_of(model_dir)
    if family is not None:  # a vision-language model: transformers' modules, the text tower paged
        if model_impl == "native" or quantization not in (None, "none") or lora is not None:
            raise ValueError(f"{model_dir} is a {family} vision-language model: it runs on transformers' modules, without --model-impl native, --quantization or LoRA adapters")
        vision = VisionPath(model_dir, family, dtype, device)
        log.info("model_path", impl=vision.impl, model=str(model_dir), family=family, load_s=round(time.perf_counter() - started, 2))
        return vision
    reason = "forced by --model-impl transformers"
    if model_impl != "transformers":
        hf = native_config.load_hf_config(model_dir)
        unsupported = families.check(hf, max_len)
        if unsupported is None:
            scheme, dense_because = served_quantization(quantization, model_dir, config.dtype_explicit, device, batch_invariant)
            path: ModelPath = NativePath(model_dir, hf, dataclasses.replace(config, quantization=scheme), dtype, device)
            extra = {"shipped_weights_served_dense": dense_because} if dense_because else {}
            log.info("model_path", impl=path.impl, model=str(model_dir), load_s=round(time.perf_counter() - started, 2), **extra)
            return path
        if model_impl == "native" or quantization not in (None, "none"):
            raise ValueError(f"{'--quantization' if quantization not in (None, 'none') else '--model-impl native'} needs the native path, which cannot run {model_dir}: {unsupported}")
        reason = unsupported
    if lora is not None:
        raise ModelRefused(f"{model_dir}: LoRA adapters are served on the native path only, which cannot run it: {reason}")
    if fp8(model_dir):
        raise ModelRefused(f"{model_dir}: its weights are FP8, served on the native path only, which cannot run it: {reason}")
    path = TransformersPath(model_dir, dtype, device, batch_invariant)
    log.info("model_path", impl=path.impl, model=str(model_dir), reason=reason, load_s=round(time.perf_counter() - started, 2))
    return path
