"""The torch + transformers runner: the only place (with its helpers) that imports torch.

Owns: loading a causal LM onto the chosen device with the paged attention implementation,
the KV cache tensors, warm-up, and `execute(plan)`: input preparation, one packed forward,
batched sampling and `.tolist()`, all on the executor's dedicated thread.
"""

from __future__ import annotations

import hashlib
import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from actors.runners import paged_attention
from actors.runners.base import ModelInfo
from actors.runners.sampler import SamplingBatch, sample, unpack_bitmask
from runtime.messages import ScheduledSeq, StepPlan, StepResult


def pick_device(requested: str | None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(requested: str | None, device: torch.device) -> torch.dtype:
    """bf16 on CUDA; on CPU bf16 only where this CPU runs it faster than fp32 (measured)."""
    if requested and requested != "auto":
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[requested]
    if device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if _cpu_bf16_is_faster() else torch.float32


def _cpu_bf16_is_faster() -> bool:
    # A decode-shaped matmul (batch 32) in both dtypes; CPUs without bf16 units emulate it and
    # lose, CPUs with AVX512-BF16/AMX win by ~2x.
    timings = {}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(32, 576, dtype=dtype)
        b = torch.randn(576, 1536, dtype=dtype)
        for _ in range(3):
            a @ b
        start = time.perf_counter()
        for _ in range(20):
            a @ b
        timings[dtype] = time.perf_counter() - start
    return timings[torch.bfloat16] < 0.8 * timings[torch.float32]


class TorchRunner:
    def __init__(
        self,
        model_dir: Path,
        *,
        device: str | None = None,
        dtype: str | None = None,
        num_kv_blocks: int | None = None,
        kv_cache_gib: float = 1.0,
        block_size: int = 16,
        num_threads: int | None = None,
        max_model_len: int | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        self._requested_device = device
        self._requested_dtype = dtype
        self._num_kv_blocks = num_kv_blocks
        self._kv_cache_gib = kv_cache_gib
        self.block_size = block_size
        self._num_threads = num_threads
        self._max_model_len = max_model_len
        self.model: torch.nn.Module | None = None
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        # Grammar masks are computed on this helper thread while the forward runs (llguidance
        # releases the GIL), so constrained requests add little to the step's critical path.
        self._mask_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="switchyard-masks")
        self._ll_executor: Any = None

    # -- life cycle ---------------------------------------------------------------------------

    def load(self) -> ModelInfo:
        from transformers import AutoModelForCausalLM

        if self._num_threads:
            torch.set_num_threads(self._num_threads)
        self.device = pick_device(self._requested_device)
        self.dtype = pick_dtype(self._requested_dtype, self.device)
        paged_attention.register()
        model = AutoModelForCausalLM.from_pretrained(
            self.model_dir, dtype=self.dtype, attn_implementation=paged_attention.ATTN_NAME
        )
        self.model = model.to(self.device).eval()
        config = model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        num_layers = text_config.num_hidden_layers
        num_kv_heads = getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
        bytes_per_slot = 2 * num_layers * num_kv_heads * head_dim * torch.finfo(self.dtype).bits // 8
        num_blocks = self._num_kv_blocks or max(
            16, int(self._kv_cache_gib * (1 << 30) // (bytes_per_slot * self.block_size))
        )
        num_slots = num_blocks * self.block_size
        shape = (num_slots, num_kv_heads, head_dim)
        self.k_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(num_layers)]
        self.v_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(num_layers)]
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        max_len = self._max_model_len or getattr(text_config, "max_position_embeddings", 2048)
        fingerprint_src = json.dumps(
            [str(self.model_dir.resolve()), str(self.dtype), self.device.type, num_blocks, self.block_size, torch.__version__]
        )
        return ModelInfo(
            max_model_len=int(max_len),
            vocab_size=int(self.vocab_size),
            device=str(self.device),
            dtype=str(self.dtype).removeprefix("torch."),
            num_kv_blocks=num_blocks,
            block_size=self.block_size,
            fingerprint="fp_" + hashlib.sha256(fingerprint_src.encode()).hexdigest()[:12],
        )

    def warmup(self) -> None:
        """Run a mixed prefill + decode step so first requests do not pay one-time costs."""
        from runtime.sampling import SamplingParams

        greedy = SamplingParams(temperature=0.0, max_tokens=1)
        plan = StepPlan(
            step_id=-1,
            seqs=[
                ScheduledSeq(request_id="warm-0", token_ids=[1] * (self.block_size + 1), start_pos=0, block_table=[0, 1], sample=True, sampling=greedy, seed=0),
                ScheduledSeq(request_id="warm-1", token_ids=[1], start_pos=0, block_table=[2], sample=True, sampling=SamplingParams(max_tokens=1, top_p=0.9), seed=1),
            ],
        )
        self.execute(plan)
        for cache in (*self.k_cache, *self.v_cache):
            cache[: 3 * self.block_size].zero_()

    def close(self) -> None:
        self._mask_pool.shutdown(wait=True)
        self.model = None
        self.k_cache = []
        self.v_cache = []

    # -- one step -----------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepResult:
        started = time.perf_counter()
        assert self.model is not None
        seqs = plan.seqs
        step, positions = paged_attention.build_step(
            [(s.start_pos, len(s.token_ids)) for s in seqs],
            [s.block_table for s in seqs],
            self.block_size,
            self.k_cache,
            self.v_cache,
        )
        input_ids = torch.tensor([t for s in seqs for t in s.token_ids], dtype=torch.long, device=self.device)
        sample_rows: list[int] = []
        logit_index: list[int] = []
        cursor = 0
        for row, s in enumerate(seqs):
            cursor += len(s.token_ids)
            if s.sample:
                sample_rows.append(row)
                logit_index.append(cursor - 1)
        sampled: dict[str, int] = {}
        guided = [(i, seqs[r].matcher) for i, r in enumerate(sample_rows) if seqs[r].matcher is not None]
        masks: Future[torch.Tensor] | None = self._mask_pool.submit(self._grammar_masks, guided) if guided else None
        outputs = self.model(
            input_ids=input_ids[None, :],
            position_ids=positions[None, :],
            use_cache=False,
            paged_step=step,
            logits_to_keep=torch.tensor(logit_index or [cursor - 1], dtype=torch.long, device=self.device),
        )
        if sample_rows:
            logits = outputs.logits[0].float()  # [S, V]
            if masks is not None:
                rows = torch.tensor([i for i, _ in guided], dtype=torch.long, device=self.device)
                allowed = masks.result().to(self.device)
                logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
            batch = SamplingBatch.build(
                [
                    (
                        seqs[r].sampling.temperature,
                        seqs[r].sampling.top_k,
                        seqs[r].sampling.top_p,
                        seqs[r].seed,
                        seqs[r].start_pos + len(seqs[r].token_ids),
                    )
                    for r in sample_rows
                ],
                self.device,
            )
            tokens = sample(logits, batch).tolist()
            for i, matcher in guided:
                matcher.consume_token(tokens[i])
            sampled = {seqs[r].request_id: tok for r, tok in zip(sample_rows, tokens)}
        return StepResult(step_id=plan.step_id, sampled=sampled, elapsed=time.perf_counter() - started)

    def _grammar_masks(self, guided: list[tuple[int, Any]]) -> torch.Tensor:
        """Allowed tokens `[G, V]` for each guided row, from its matcher's current state."""
        import llguidance
        import llguidance.torch

        if self._ll_executor is None:
            self._ll_executor = llguidance.LLExecutor(num_threads=1)
        bitmask = llguidance.torch.allocate_token_bitmask(len(guided), self.vocab_size)
        llguidance.torch.fill_next_token_bitmask_par(self._ll_executor, [(m, j) for j, (_, m) in enumerate(guided)], bitmask)
        allowed = unpack_bitmask(bitmask, self.vocab_size)
        # A matcher in an error state allows nothing; rather than sample from an empty set,
        # let that row go unconstrained (its text is then checked by whoever parses it).
        empty = ~allowed.any(dim=-1)
        if bool(empty.any()):
            allowed[empty] = True
        return allowed
