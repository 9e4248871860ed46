"""The native model path as the runner sees it: load, step metadata, forward.

Owns: `NativePath`, which reads the checkpoint (actors/runners/native/loader.py), builds the
model of its family (families.py) and answers the runner's `ModelPath` interface, and which step runs where.
On a CPU in bf16 with dense or shipped weights, every step runs on the row-invariant kernels
(rowwise.py; `rowwise_applies` says when). Otherwise llama.py's model: on a GPU steps of up
to the token budget as CUDA graphs, a row per token (cuda_graphs.py); with `--compile` decode
steps and a sequence's few-token step through compiled graphs (decode_graph.py; graph_steps.py
says which step takes which); every other step eager.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

from actors.runners.invariant import fixed_block_linear
from actors.runners.native import attention, decode_graph, families, graph_steps, quant, shipped, smoothing
from actors.runners.native.config import NativeConfig
from actors.runners.native.cuda_graphs import BucketedDecode, DecodeBatch
from actors.runners.native.kernels import ops as kernels
from actors.runners.native.kernels.build import KernelsUnavailable, library
from actors.runners.native.loader import load_weights
from actors.runners.native.lora import Adapters
from actors.runners.native.rowwise import RowwiseModel, pack_weights
from actors.runners.runner_config import RunnerConfig
from runtime.adapters import LoraSettings
from runtime.logging import get_logger

log = get_logger("runner")


_NO_POSITIONS = torch.empty(0, dtype=torch.long)  # a bucketed decode step computes its own


def rowwise_applies(
    cfg: NativeConfig, family: Any, device: torch.device, dtype: torch.dtype, quantization: str | None, batch_invariant: bool | None
) -> bool:  # fmt: skip
    """Whether steps run on the row-invariant kernels: a family they compute (its `ROWWISE`), on
    a CPU, in bf16, dense or shipped weights (not int8/int4), shapes the kernels take, unless
    --no-batch-invariant; and the kernels build here (else False by default, an error when
    --batch-invariant asks for them)."""
    if device.type != "cpu" or dtype != torch.bfloat16 or quantization not in (None, shipped.SCHEME) or batch_invariant is False:
        return False
    if not getattr(family, "ROWWISE", False):
        if batch_invariant:
            raise ValueError(f"--batch-invariant: the row-invariant kernels do not compute the {cfg.family} family")
        return False
    try:
        shapes = kernels.unsupported(cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads)
        if shapes:
            raise KernelsUnavailable(f"the row-invariant kernels do not take {shapes}")
        library()
    except KernelsUnavailable as exc:
        if batch_invariant:
            raise ValueError(f"--batch-invariant: {exc}") from None
        log.warning("rowwise_kernels_unavailable", reason=str(exc))
        return False
    return True


class NativePath:
    takes_images = False
    impl = "native"  # with "+int8" / "+int4" / "+q4_1" (as shipped), "+compiled", "+cudagraphs" when so (shown in /v1/models)

    def __init__(self, model_dir: Path, hf: Any, config: RunnerConfig, dtype: torch.dtype, device: torch.device) -> None:
        """`config.quantization` is the scheme served (model_paths.served_quantization resolved it)."""
        batch_invariant, max_len, compile, quantization, lora = config.batch_invariant, config.max_model_len, config.compile, config.quantization, config.lora
        cfg = families.native_config(hf)
        family = families.family(hf)
        self.cfg = cfg
        self.batch_invariant = batch_invariant
        self.num_layers = cfg.num_layers
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.max_position_embeddings = cfg.max_position_embeddings
        weights = load_weights(model_dir, cfg, dtype, device, family.layer_weights)
        self.vocab_size = weights.lm_head.shape[0]
        self.bucketed: BucketedDecode | None = None
        self.decode_graph: decode_graph.DecodeGraph | None = None
        self.adapters: Adapters | None = None
        self.rowwise = rowwise_applies(cfg, family, device, dtype, quantization, batch_invariant)
        if self.rowwise:
            started = time.perf_counter()
            served = pack_weights(weights, model_dir, cfg.tie_word_embeddings, blocks=quantization == shipped.SCHEME, swiglu=lora is None)
            self.model: Any = RowwiseModel(cfg, weights, max_len or cfg.max_position_embeddings)
            self.impl = f"native+{shipped.describe(served) if quantization == shipped.SCHEME else 'bf16'}+rowwise"
            self._adapt(lora, cfg, dtype, device, kernel=True)
            log.info("rowwise_weights", matrices=dict(served), seconds=round(time.perf_counter() - started, 2))
            if compile:
                log.warning("compile_skipped", reason="the row-invariant kernels run every step; --compile's graphs would change its rounding")
            return
        self.model = family.Model(cfg, weights, max_len or cfg.max_position_embeddings)
        if batch_invariant:
            self.model.linear = fixed_block_linear
        if quantization:
            self.impl = f"native+{self._quantize(weights, model_dir, quantization)}"
        if lora is not None:  # per row: grouped on the eager forward, gathered in the CUDA graphs' buckets; no --compile graphs
            self._adapt(lora, cfg, dtype, device)
            compile = False
        self._graphs(config, compile, device, max_len or cfg.max_position_embeddings)
        if self.adapters is not None and self.bucketed is not None:
            self.adapters.fix_rows(self.bucketed.batches[-1], device)

    def _adapt(self, lora: LoraSettings | None, cfg: NativeConfig, dtype: torch.dtype, device: torch.device, kernel: bool = False) -> None:
        """--enable-lora: the adapters' slots on the model, the ones named at start loaded
        (applied by the row-invariant kernels when `kernel`)."""
        if lora is None:
            return
        started = time.perf_counter()
        self.adapters = self.model.adapters = Adapters(list(lora.adapters), _projection_sizes(cfg), cfg.num_layers, dtype, device, lora.max_loras, lora.max_rank, kernel, lora.max_cpu_loras)
        log.info("lora_adapters_loaded", adapters=[a.name for a in lora.adapters], seconds=round(time.perf_counter() - started, 3))
        self.impl += "+lora"

    def _graphs(self, config: RunnerConfig, compile: bool | None, device: torch.device, max_len: int) -> None:
        """The steps' graphs: CUDA graphs on by default on a GPU (None), off when asked (False);
        True on a CPU runs the same bucketed steps without capture, which is how the CPU suite
        checks them. --compile's decode graphs (default: on a CPU off the buckets; never with
        adapters: `compile` is the config's, or False)."""
        cuda_graphs, batch_invariant, block_size, max_num_seqs, max_step_tokens = config.cuda_graphs, config.batch_invariant, config.block_size, config.max_num_seqs, config.max_step_tokens
        if cuda_graphs is None:
            cuda_graphs = device.type == "cuda"
        if cuda_graphs and not batch_invariant:  # batch invariance groups decodes by its own buckets
            capture = device.type == "cuda"
            self.bucketed = BucketedDecode(self.model, self.vocab_size, max_len, block_size, device, capture, max_num_seqs, max_step_tokens)
            self.impl += "+cudagraphs" if capture else "+buckets"
        if compile is None:  # the default: on a CPU, where one stream's step is Python-bound (docs/models.md)
            compile = device.type == "cpu" and self.bucketed is None and not batch_invariant
        if compile and self.bucketed is not None:
            log.warning("compile_skipped", reason="decode steps run as CUDA graphs; --compile's one-row graph would never run")
        elif compile:
            self.impl += "+compiled"
            # Before the first torch.compile: importing inductor fixes its cache directory.
            decode_graph.use_disk_cache()
            self.decode_graph = decode_graph.DecodeGraph(self.model, max_num_seqs, max_step_tokens or 512)  # compiled in the background once the runner is warm

    def _quantize(self, weights, model_dir: Path, quantization: str) -> str:
        """Quantized linears in place of the dense ones; what is served ("int8", "q4_1", ...)."""
        assert not isinstance(self.model, RowwiseModel)
        bits = 4 if quantization == shipped.SCHEME else {"int8": 8, "int4": 4}[quantization]
        started = time.perf_counter()
        smooth = smoothing.prepare(self.model, model_dir, bits)
        if smoothing.ALPHA is not None:
            log.info("smoothed", alpha=smoothing.ALPHA, seconds=round(time.perf_counter() - started, 2))
        if quantization != shipped.SCHEME:
            quant.quantize_model(weights, bits, smooth)
            self.model.linear = quant.QuantLinear(quant.MAX_ROWS[bits])
            return quantization
        dense_rows = shipped.dense_past_rows(weights.embed.device)
        served = shipped.quantize_model(weights, model_dir, self.cfg.tie_word_embeddings, smooth, keep_dense=dense_rows is not None)
        # The weight-only kernel at every width (past dense_rows the bf16 GEMM, on AMX): the int8
        # GEMM quantizes the activations, which only --quantization int8|int4 asks for.
        self.model.linear = quant.QuantLinear(sys.maxsize, dense_rows)
        log.info("shipped_weights", matrices=dict(served), dense_past_rows=dense_rows, seconds=round(time.perf_counter() - started, 2))
        return shipped.describe(served)

    def compile_in_background(self, scratch_blocks: list[int], block_size: int, k_cache, v_cache) -> None:
        """Once warm: compile the decode graphs off the device thread (--compile), their
        compiling calls running in `scratch_blocks`, KV blocks no request holds (every row of a
        several-row compiling call in the same blocks)."""
        if self.decode_graph is not None:
            def scratch(seqs: list[tuple[int, int]]) -> tuple[Any, torch.Tensor]:
                return attention.build_step(seqs, [scratch_blocks] * len(seqs), block_size, k_cache, v_cache)

            self.decode_graph.compile_in_background(scratch, k_cache, v_cache)

    def build_step(self, seqs, tables, block_size, k_cache, v_cache):
        if self.rowwise:
            rows = kernels.RowStep.build(seqs, tables, block_size)
            return rows, rows.positions
        if self.bucketed is not None and block_size == self.bucketed.block_size:
            plan = self.bucketed.plan(seqs, tables)
            if plan is not None:
                return plan, _NO_POSITIONS
        return attention.build_step(seqs, tables, block_size, k_cache, v_cache, per_sequence_decode=self.batch_invariant, gather_fresh=self._mixed(seqs))

    def _mixed(self, seqs: list[tuple[int, int]]) -> bool:
        """Whether a step of `seqs` runs a mixed graph (decode rows beside one prompt chunk), which
        reads a fresh chunk's keys from the cache too."""
        graph = self.decode_graph
        chunks = sum(1 for _, n in seqs if n > 1)
        decodes = len(seqs) - chunks
        return graph is not None and chunks == 1 and decodes >= graph_steps.MIXED_MIN_ROWS and graph.mixed_ready(sum(n for _, n in seqs), decodes + 1)

    @property
    def prompt_chunks(self) -> int | None:
        """ModelInfo.prompt_chunks: 1 when mixed graphs compile (a step of one prompt chunk beside
        the decodes runs one; a step of two runs eager), else any."""
        graph = self.decode_graph
        return 1 if graph is not None and graph.mixed else None

    def with_images(self, seqs, requests, positions):
        return positions

    def adapter_rows(self, seqs: Any, fed: list[list[int]], device: torch.device) -> None:
        """This step's rows' adapters (each request's `sampling.adapter`), before its forward."""
        if self.adapters is not None:
            self.adapters.rows([s.sampling.adapter for s, tokens in zip(seqs, fed) for _ in tokens], device)

    def forward(self, input_ids, positions, step, keep, k_cache, v_cache):
        if isinstance(self.model, RowwiseModel):
            return self.model.forward(input_ids, step, keep, k_cache, v_cache)
        if isinstance(step, DecodeBatch):
            assert self.bucketed is not None
            return self.bucketed(input_ids, step, keep, k_cache, v_cache)
        graph = self.decode_graph
        if graph is not None and graph.ready and graph_steps.applies(input_ids, step, keep):
            return graph(input_ids, positions, step, k_cache, v_cache)
        if graph is not None and graph_steps.applies_rows(input_ids, step, keep) and graph.rows_ready(input_ids.shape[0]):
            return graph.rows(input_ids, positions, step, keep, k_cache, v_cache)
        if graph is not None and graph_steps.applies_mixed(input_ids, step) and graph.mixed_ready(input_ids.shape[0], keep.shape[0]):
            return graph.mixed_step(input_ids, positions, step, keep, k_cache, v_cache)
        if graph is not None and graph.few_ready and graph_steps.applies_few(input_ids, step):
            return graph.few(input_ids, positions, step, k_cache, v_cache)[keep]  # one sequence: its tokens are the step's rows
        return self.model.forward(input_ids, positions, step, keep, k_cache, v_cache)


def _projection_sizes(cfg: NativeConfig) -> dict[str, tuple[int, int]]:
    """Each projection's (input, output) widths, as PEFT names them."""
    q, kv, d, i = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
    return {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d), "gate_proj": (d, i), "up_proj": (d, i), "down_proj": (i, d)}
