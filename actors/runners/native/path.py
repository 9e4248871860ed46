"""The native model path as the runner sees it: load, step metadata, forward.

Owns: `NativePath`, which reads the checkpoint (actors/runners/native/loader.py), builds the
Llama-family model (llama.py) and answers the runner's `ModelPath` interface.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from actors.runners.invariant import fixed_block_linear
from actors.runners.native import attention, decode_graph, quant, smoothing
from actors.runners.native.config import native_config
from actors.runners.native.llama import LlamaModel
from actors.runners.native.loader import load_weights
from runtime.logging import get_logger

log = get_logger("runner")


class NativePath:
    impl = "native"  # with "+int8" / "+int4" and "+compiled" when so (shown in /v1/models)

    def __init__(
        self,
        model_dir: Path,
        hf: Any,
        dtype: torch.dtype,
        device: torch.device,
        batch_invariant: bool,
        max_len: int | None,
        compile: bool = False,
        quantization: str | None = None,
    ) -> None:
        cfg = native_config(hf)
        self.cfg = cfg
        self.batch_invariant = batch_invariant
        self.num_layers = cfg.num_layers
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.max_position_embeddings = cfg.max_position_embeddings
        weights = load_weights(model_dir, cfg, dtype, device)
        self.vocab_size = weights.lm_head.shape[0]
        self.model = LlamaModel(cfg, weights, max_len or cfg.max_position_embeddings)
        if batch_invariant:
            self.model.linear = fixed_block_linear
        if quantization:
            bits = {"int8": 8, "int4": 4}[quantization]
            started = time.perf_counter()
            smooth = smoothing.prepare(self.model, model_dir, bits)
            if smoothing.ALPHA is not None:
                log.info("smoothed", alpha=smoothing.ALPHA, seconds=round(time.perf_counter() - started, 2))
            quant.quantize_model(weights, bits, smooth)
            self.model.linear = quant.QuantLinear(quant.MAX_ROWS[bits])
            self.impl = f"native+{quantization}"
        self.decode_graph: decode_graph.DecodeGraph | None = None
        if compile:
            self.impl += "+compiled"
            # Before the first torch.compile: importing inductor fixes its cache directory.
            decode_graph.use_disk_cache()
            self.decode_graph = decode_graph.DecodeGraph(self.model)  # compiled by the runner's warm-up decode step

    def build_step(self, seqs, tables, block_size, k_cache, v_cache):
        return attention.build_step(seqs, tables, block_size, k_cache, v_cache, per_sequence_decode=self.batch_invariant)

    def forward(self, input_ids, positions, step, keep, k_cache, v_cache):
        if self.decode_graph is not None and decode_graph.applies(input_ids, step, keep):
            return self.decode_graph(input_ids, positions, step, k_cache, v_cache)
        return self.model.forward(input_ids, positions, step, keep, k_cache, v_cache)
