"""The torch + transformers runner: the only place (with its helpers) that imports torch.

Owns: loading a causal LM onto the chosen device with the paged attention implementation,
the KV cache tensors, warm-up, and `execute(plan)`: input preparation, one packed forward,
batched sampling and `.tolist()`, all on the executor's dedicated thread.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from actors.runners import calibration, paged_attention
from actors.runners.attention_check import check_attention
from actors.runners.draft_model import DraftModel
from actors.runners.grammar_masks import GrammarMasks, consume
from actors.runners.host_malloc import keep_freed_memory
from actors.runners.kv_alloc import kv_blocks, lazy_zeros
from actors.runners.logit_rows import Draw, LogitRows
from actors.runners.model_paths import ModelPath, TransformersPath, choose
from actors.runners.native.decode_graph import DecodeGraph
from actors.runners.native.graph_steps import SCRATCH_TOKENS
from actors.runners.native.lora import Adapters
from actors.runners.native.path import NativePath
from actors.runners.request_state import RequestStates
from actors.runners.runner_config import RunnerConfig
from actors.runners.sampler import SamplingBatch, apply_penalties, sample
from actors.runners.vision.path import VisionPath
from runtime.kv_budget import GIB
from runtime.logging import get_logger
from runtime.messages import NewRequest, ScheduledSeq, StepPlan, StepResult
from runtime.protocol import ModelInfo
from runtime.sampling import SamplingParams

log = get_logger("runner")


def pick_device(requested: str | None) -> torch.device:
    """The device asked for ("auto"/None: CUDA when torch sees it, else the CPU), a CUDA device
    always with its index: `torch.cuda.set_device` (the runner's load) refuses a bare "cuda"."""
    device = torch.device(requested if requested and requested != "auto" else "cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def device_key(requested: str | None) -> str:
    """The device as one name for every way of asking for it: "auto", "cuda" -> "cuda:0"."""
    return str(pick_device(requested))


def pick_dtype(requested: str | None, device: torch.device) -> torch.dtype:
    """bf16 on CUDA; on CPU bf16 only where this CPU runs it natively (faster than fp32)."""
    if requested and requested != "auto":
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[requested]
    if device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if _cpu_has_native_bf16() else torch.float32


def _cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: bf16 matmuls run in hardware (measured here with AMX: a bare decode
    step at batch 32 is 1.7x faster in bf16, prefill 3x; CPUs without them emulate bf16 and lose).

    Decided from the CPU's features, not by timing a matmul at start-up: a timing taken while
    anything else runs on a 2-core machine picked fp32 on an AMX CPU. Timing is the fallback
    only when this torch cannot say.
    """
    probes: list[Any] = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if all(probe is not None for probe in probes):
        return any(probe() for probe in probes)
    return _cpu_bf16_is_faster()


def _cpu_bf16_is_faster() -> bool:
    # A decode-shaped matmul (batch 32) in both dtypes.
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


def _weights_identity(model_dir: Path) -> list[object]:
    """The checkpoint as served: its path and every weight/config file's name, size and mtime
    (new weights written to the same directory change the fingerprint; no file is read)."""
    files = sorted(p for p in model_dir.iterdir() if p.suffix in (".safetensors", ".bin", ".json", ".model"))
    return [str(model_dir.resolve()), [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]]


class TorchRunner:
    def __init__(self, model_dir: Path, config: RunnerConfig | None = None) -> None:
        self.model_dir = Path(model_dir)
        self.config = config = config or RunnerConfig()  # every setting, handed whole to what it builds
        self.device_key = device_key(config.device)
        self.block_size = config.block_size
        self.model: ModelPath | None = None
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        # Grammar masks are computed on a helper thread while the forward runs (llguidance
        # releases the GIL), so constrained requests add little to the step's critical path.
        self.masks: GrammarMasks | None = None  # made with the vocabulary, at load
        self.requests = RequestStates()  # per-request history and grammar state; this thread its only writer
        self.draft = DraftModel(config.draft_model) if config.draft_model is not None else None  # --spec-decoding draft

    # -- life cycle ---------------------------------------------------------------------------

    def load(self) -> ModelInfo:
        config = self.config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.device = pick_device(config.device)
        if self.device.type == "cuda":  # this is the device thread: its kernels, streams and graphs go here
            torch.cuda.set_device(self.device)
        self.dtype = pick_dtype(config.dtype, self.device)
        if self.device.type == "cpu":  # the step's large tensors reuse freed memory, not fresh pages (host_malloc.py)
            keep_freed_memory()
        model = choose(self.model_dir, config, self.dtype, self.device)
        self.model = model
        bytes_per_slot = 2 * model.num_layers * model.num_kv_heads * model.head_dim * torch.finfo(self.dtype).bits // 8
        max_len = config.max_model_len or model.max_position_embeddings
        reserve = 2 * config.max_num_seqs * model.vocab_size * 4 + (GIB if self.device.type == "cuda" else GIB // 4)  # logits, a step's work
        num_blocks = kv_blocks(
            self.device, bytes_per_slot * self.block_size, self.block_size, int(max_len), config.max_num_seqs,
            num_blocks=config.num_kv_blocks, gib=config.kv_cache_gib, fraction=config.memory_utilization, parts=config.memory_parts, reserve=reserve,
        )  # fmt: skip
        # A compiled path keeps blocks past those it reports: the background compile runs its
        # steps there (graph_steps.SCRATCH_TOKENS says how many tokens the longest holds).
        scratch = -(-SCRATCH_TOKENS // self.block_size) if self._decode_graph() is not None else 0
        num_slots = (num_blocks + scratch) * self.block_size
        self._scratch_blocks = list(range(num_blocks, num_blocks + scratch))
        shape = (model.num_kv_heads, num_slots, model.head_dim)  # head-major: see paged_attention
        self.k_cache = [lazy_zeros(shape, self.dtype, self.device) for _ in range(model.num_layers)]
        self.v_cache = [lazy_zeros(shape, self.dtype, self.device) for _ in range(model.num_layers)]
        self.vocab_size = model.vocab_size
        if isinstance(model, TransformersPath | VisionPath):  # transformers' modules: their attention against the model's own, before serving
            worst = check_attention(model, self.k_cache, self.v_cache, self.block_size, str(self.model_dir))
            log.info("attention_checked", model=str(self.model_dir), max_logprob_diff=round(worst, 6))
        self.masks = GrammarMasks(self.vocab_size)
        self._max_len = int(max_len)
        if self.draft is not None:  # its own cache, the same slots and block tables (actors/runners/draft_model.py)
            if model.takes_images:
                raise ValueError(f"--spec-decoding draft: {self.model_dir} is a vision-language model; a draft model drafts for text models only")
            self.draft.load(self.dtype, self.device, num_slots, self.block_size, self.vocab_size, self._max_len)
        fingerprint_src = json.dumps(
            [_weights_identity(self.model_dir), str(self.dtype), self.device.type, self._kv_request(), self.block_size, int(max_len), torch.__version__, config.batch_invariant, model.impl]
        )
        return ModelInfo(
            max_model_len=int(max_len),
            vocab_size=int(self.vocab_size),
            device=str(self.device),
            dtype=str(self.dtype).removeprefix("torch."),
            num_kv_blocks=num_blocks,
            block_size=self.block_size,
            fingerprint="fp_" + hashlib.sha256(fingerprint_src.encode()).hexdigest()[:12],
            impl=model.impl,
            prompt_chunks=getattr(model, "prompt_chunks", None),
            rowwise=bool(getattr(model, "rowwise", False)),
        )

    def _kv_request(self) -> list[Any]:
        """What the cache's size was asked as (not the blocks the memory gave: those may differ
        between starts and replicas, and change no answer)."""
        config = self.config
        return [config.num_kv_blocks, config.kv_cache_gib, config.memory_utilization, config.memory_parts]

    def warmup(self) -> list[calibration.Sample]:
        """Run a mixed prefill + decode step so first requests do not pay one-time costs, then
        time the calibration steps that seed the scheduler's step cost model."""
        greedy = SamplingParams(temperature=0.0, max_tokens=1)
        prompt = (1,) * (self.block_size + 1)
        plan = StepPlan(
            step_id=-1,
            seqs=(
                ScheduledSeq(request_id="warm-0", token_ids=list(prompt), start_pos=0, block_table=[0, 1], sample=True, sampling=greedy, seed=0),
                ScheduledSeq(request_id="warm-1", token_ids=[1], start_pos=0, block_table=[2], sample=True, sampling=SamplingParams(max_tokens=1, top_p=0.9), seed=1),
            ),
            new_requests=(NewRequest(request_id="warm-0", prompt_token_ids=prompt), NewRequest(request_id="warm-1", prompt_token_ids=(1,))),
        )
        self.execute(plan)
        # Then one sequence decoding alone, the step a single stream repeats.
        decode = ScheduledSeq(request_id="warm-0", token_ids=[1], start_pos=self.block_size + 1, block_table=[0, 1, 2], sample=True, sampling=greedy, seed=0)
        self.execute(StepPlan(step_id=-1, seqs=(decode,)))
        bucketed = getattr(self.model, "bucketed", None)
        if bucketed is not None and bucketed.capture:  # CUDA graphs for every batch bucket now, not under traffic
            bucketed.capture_all(self.k_cache, self.v_cache)
        timed, slots = calibration.plans(self.block_size, self.k_cache[0].shape[1] // self.block_size, self._max_len)
        samples = calibration.time_steps(self.execute, timed)
        for cache in (*self.k_cache, *self.v_cache, *(self.draft.caches() if self.draft is not None else ())):
            cache[:, : max(3 * self.block_size, slots)].zero_()
        self.requests = RequestStates()  # nothing of the warm-up's requests stays
        self.compile_in_background()  # serve eager now, the compiled graph when it is ready
        return samples

    def compile_in_background(self) -> DecodeGraph | None:
        """A compiled native path (--compile, the CPU's default): start compiling its one-row
        decode graph on a thread of its own, swapped in when ready; the graph, to wait for
        (None: nothing to compile)."""
        graph = self._decode_graph()
        if graph is not None and not graph.ready:
            assert isinstance(self.model, NativePath)
            self.model.compile_in_background(self._scratch_blocks, self.block_size, self.k_cache, self.v_cache)
        return graph

    def _decode_graph(self) -> DecodeGraph | None:
        return self.model.decode_graph if isinstance(self.model, NativePath) else None

    def adapters(self) -> Adapters:
        """The LoRA adapters' slots (--enable-lora; actors/lora_control.py loads and unloads)."""
        if not isinstance(self.model, NativePath) or self.model.adapters is None:
            raise ValueError("this model serves no LoRA adapters (start it with --enable-lora)")
        return self.model.adapters

    def close(self) -> None:
        if self.masks is not None:
            self.masks.close()
        self.model = None
        self.k_cache = []
        self.v_cache = []
        if self.draft is not None:
            self.draft.close()

    # -- one step -----------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepResult:
        started = time.perf_counter()
        assert self.model is not None
        self.requests.apply(plan)
        if not isinstance(self.model, VisionPath):
            return self._step(plan, started)
        self.model.encode_ahead(plan, self.requests)  # images of admitted requests, before the steps that feed their tokens
        return self.model.report(self._step(plan, started))

    def _step(self, plan: StepPlan, started: float) -> StepResult:
        assert self.model is not None
        seqs = plan.seqs
        if not seqs:
            return StepResult(step_id=plan.step_id, sampled={})
        step, positions = self.model.build_step(
            [(s.start_pos, len(s.token_ids)) for s in seqs], [s.block_table for s in seqs], self.block_size, self.k_cache, self.v_cache
        )
        if self.model.takes_images:  # image rows and (M-RoPE) positions for this step's prompt chunks
            positions = self.model.with_images(seqs, self.requests, positions)
        if plan.block_copies:
            paged_attention.copy_blocks(self.k_cache, self.v_cache, list(plan.block_copies), self.block_size)
        fed = [self.requests.input_ids(s) for s in seqs]
        drafts = self.draft.propose(plan.block_copies, seqs, fed) if self.draft is not None else None
        if drafts is not None:  # DRAFT_TOKEN placeholders filled with the draft model's tokens
            seqs, fed = drafts.seqs, drafts.fed
        input_ids = torch.tensor([t for tokens in fed for t in tokens], dtype=torch.long, device=self.device)
        rows = LogitRows.plan(seqs, self.requests)
        assert self.masks is not None
        masks = self.masks.start(rows.draws)
        keep = torch.tensor(rows.index or [input_ids.shape[0] - 1], dtype=torch.long, device=self.device)
        if isinstance(self.model, NativePath) and self.model.adapters is not None:  # each row's adapter (native/lora.py)
            self.model.adapter_rows(seqs, fed, self.device)
        logits = self.model.forward(input_ids, positions, step, keep, self.k_cache, self.v_cache)
        if not rows.index:
            return StepResult(step_id=plan.step_id, sampled={}, elapsed=time.perf_counter() - started)
        all_logits = logits.float()  # [rows, V], raw model scores
        logprob_rows = rows.logprob_rows()
        if logprob_rows:  # every row in order (each request asked for them) reads the logits as they are, no copy
            logprobs = torch.log_softmax(all_logits if logprob_rows == list(range(all_logits.shape[0])) else all_logits[logprob_rows], dim=-1)
        else:
            logprobs = None
        sampled: dict[str, int] = {}
        failed: dict[str, str] = {}
        kept: dict[str, int] = {}
        if rows.draws:
            allowed, broken = self.masks.allowed(masks) if masks is not None else (None, {})
            sampled, failed, kept = self._sample(all_logits, rows.draws, masks.guided if masks is not None else [], allowed, broken)
        collected = rows.collect_logprobs(seqs, self.requests, logprobs, sampled, kept) if logprobs is not None else {}
        spec = self.draft.finish(drafts, kept) if drafts is not None and self.draft is not None else {}
        return StepResult(step_id=plan.step_id, sampled=sampled, failed=failed, accepted=kept, logprobs=collected, elapsed=time.perf_counter() - started, **spec)

    def _sample(
        self,
        all_logits: torch.Tensor,
        draws: list[Draw],
        guided: list[tuple[int, Any]],
        allowed: torch.Tensor | None,
        broken: dict[int, str],
    ) -> tuple[dict[str, int], dict[str, str], dict[str, int]]:
        """One token per draw, batched; a request whose part raises fails alone. Also, per request
        that drafted, how many draft tokens it keeps (the sampled token then follows them).

        The batched path runs first. If it raises, each draw is redone on its own and only the
        draws that raise again fail, so one request's bad state never fails its step.
        """
        params = [(d.seq.sampling.temperature, d.seq.sampling.top_k, d.seq.sampling.top_p, d.seed, d.position) for d in draws]
        mask_of = {i: j for j, (i, _) in enumerate(guided)}
        failed = {draws[i].request_id: f"grammar error: {message}" for i, message in broken.items()}
        try:
            tokens: list[int | None] = self._sample_rows(all_logits, draws, params, mask_of, allowed, range(len(draws)))
        except Exception:
            tokens = []
            for i in range(len(draws)):
                try:
                    tokens += self._sample_rows(all_logits, draws, params, mask_of, allowed, [i])
                except Exception as exc:
                    failed.setdefault(draws[i].request_id, f"sampling failed: {type(exc).__name__}: {exc}")
                    tokens.append(None)
        sampled: dict[str, int] = {}
        kept: dict[str, int] = {}
        for draw, token in zip(draws, tokens):
            if token is None or draw.request_id in failed or draw.request_id in sampled:
                continue
            if draw.checks is not None:  # a verify row: the draft stands while it is what was sampled
                if token == draw.checks:
                    if consume(draw, token, failed):
                        kept[draw.request_id] = kept.get(draw.request_id, 0) + 1
                    continue
                kept.setdefault(draw.request_id, 0)
            if consume(draw, token, failed):
                sampled[draw.request_id] = token
        return sampled, failed, kept

    def _sample_rows(
        self,
        all_logits: torch.Tensor,
        draws: list[Draw],
        params: list[tuple[float, int, float, int, int]],
        mask_of: dict[int, int],
        allowed: torch.Tensor | None,
        which: range | list[int],
    ) -> list[int | None]:
        """Penalties, grammar masks and sampling for the draws `which`, as one batch."""
        which = list(which)
        rows = [draws[i].row for i in which]
        penalized = [j for j, i in enumerate(which) if draws[i].seq.sampling.has_penalties]
        masked = [(j, mask_of[i]) for j, i in enumerate(which) if i in mask_of]
        if penalized or (masked and allowed is not None) or rows != list(range(all_logits.shape[0])):
            # a copy, which penalties and masks write into (forks of one row get their own)
            logits = all_logits.index_select(0, torch.tensor(rows, dtype=torch.long, device=all_logits.device))
        else:
            logits = all_logits  # every row once, in order, nothing written: sampling only reads it
        if penalized:  # in place: `logits` is this batch's copy
            sub = [draws[which[j]] for j in penalized]
            apply_penalties(
                logits,
                [(np.concatenate([d.state.history_array(), d.prefix]) if d.prefix else d.state.history_array(), d.state.num_prompt_tokens) for d in sub],
                [d.seq.sampling.presence_penalty for d in sub],
                [d.seq.sampling.frequency_penalty for d in sub],
                [d.seq.sampling.repetition_penalty for d in sub],
                rows=penalized,
            )
        if masked and allowed is not None:
            local = torch.tensor([j for j, _ in masked], dtype=torch.long, device=self.device)
            rows_allowed = allowed[[m for _, m in masked]].to(self.device)
            logits[local] = logits[local].masked_fill(~rows_allowed, float("-inf"))
        batch = SamplingBatch.build([params[i] for i in which], self.device)
        return sample(logits, batch).tolist()
