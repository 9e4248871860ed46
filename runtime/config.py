"""`RuntimeConfig`: every knob, built once at start-up from the CLI (no scattered os.environ).

Imports msgspec only.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

SPEC_DECODING_MODES = ("off", "ngram", "draft", "auto")
# 1.7, not 2: steps scatter ~15% around the fit on a shared CPU, and at 2 the p99 gap came out
# over 2x the p50 in 7 of 8 rounds (docs/performance.md, "Step budget and stalls").
TEXT_STEP_STRETCH = 1.7
# An image prompt is hundreds of placeholder tokens: while images come in, nearly every step
# carries a prompt chunk, so the streams' p99 gap is such a step's, the stretch plus the steps'
# scatter (1.98 at 1.7 against 1.65 at 1.5, ops/results/vision-c4-images-c2-smollm2-tower-*.json).
IMAGE_STEP_STRETCH = 1.5


class RuntimeConfig(msgspec.Struct, kw_only=True):
    model: str | None = None  # None: the embedded default of `task`; else a local HF directory
    task: str = "chat"  # chat | completions (both served by the generation engine) | embeddings
    served_name: str | None = None  # defaults to the model's name
    device: str | None = None  # None: cuda if available, else cpu
    dtype: str = "auto"  # auto: bf16 on cuda, and on cpus with native bf16 (AVX512-BF16 or AMX)
    kv_cache_gib: float | None = None  # None: sized from memory_utilization (runtime/kv_budget.py)
    num_kv_blocks: int | None = None  # overrides kv_cache_gib
    memory_utilization: float | None = None  # the device memory's share the process may use; None: 0.9 of a GPU, 0.5 of a CPU host
    memory_parts: int = 1  # models in this process sizing their caches from that share: each takes one part
    block_size: int = 16
    max_num_seqs: int = 128  # running requests per step
    max_num_batched_tokens: int = 512  # tokens per step: decode tokens + prefill chunks
    max_num_batched_tokens_embed: int = 8192  # tokens per embedding step (no KV cache to bound it)
    # While requests stream, a step carries prompt chunks worth at most (step_stretch - 1) x its
    # decodes' own time, measured on this machine's steps (actors/step_cost.py): a stream's gap
    # between chunks stays within step_stretch x a decode step. None: the token budget alone.
    # "auto": TEXT_STEP_STRETCH, or IMAGE_STEP_STRETCH for a model that reads images (stretch_for).
    step_stretch: float | Literal["auto"] | None = "auto"
    # While requests stream, the most prompt chunks a step carries; None: the runner's choice
    # (ModelInfo.prompt_chunks: 1 where only steps of one chunk beside the decodes compile).
    max_prompt_chunks: int | None = None
    # When prompts waiting to start outnumber the streams 4 to 1 (a burst of arrivals), one step
    # starts them all, up to this many tokens, each chunk still at most max_num_batched_tokens;
    # 0: never (actors/sched_core.py says why). 8192 starts a burst of 64 128-token prompts at once.
    burst_tokens: int = 8192
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    max_pending: int = 512  # admitted, unfinished requests; past this submit() says Overloaded
    # Estimated tokens (prompt + max_tokens, see runtime.admission.estimate_tokens) of admitted,
    # unfinished requests; past this submit() says Overloaded. None: no token budget.
    max_pending_tokens: int | None = None
    num_threads: int | None = None  # torch intra-op threads; None: leave torch's default
    # A request's tokens and logprobs never depend on the step it rides in. None (the default):
    # where the row-invariant kernels serve (the native path on a CPU in bf16, dense or shipped
    # weights: actors/runners/native/rowwise.py), else nothing extra. True: those kernels, and
    # elsewhere every matmul in fixed 32-row blocks (actors/runners/invariant.py; slower).
    # False: neither (the shape-dependent kernels).
    batch_invariant: bool | None = None
    # Which model code runs the steps: "native" (our Llama-family decoder, for the
    # architectures it supports), "transformers" (any causal LM), or "auto" (native when it can).
    model_impl: str = "auto"
    # torch.compile a single stream's whole decode step on the native path as one graph, on a
    # background thread while the eager step serves (actors/runners/native/decode_graph.py);
    # larger steps stay eager, where compiling did not pay. None: on for the native path on a
    # CPU, where the one-row step is bound by Python between its ~6,000 small calls
    # (ops/results/step-ab-decode-shipped-compile-2026-11-26-xeon-amx.json); off on CUDA, whose
    # decode steps are CUDA graphs. The first start compiles for ~2 minutes on 2 cores
    # (inductor's disk cache after), the eager steps serving meanwhile.
    compile: bool | None = None
    # "int8" or "int4" for the native path's linear layers: weight-only kernels for steps of
    # few rows, an int8 GEMM beyond (actors/runners/native/quant.py); "shipped": the same
    # kernels on the checkpoint's own quantized blocks (the embedded SmolLM2's Q4_1,
    # actors/runners/native/shipped.py); "none": dense. None: "shipped" on CPU where the
    # checkpoint ships quantized weights and `dtype` is "auto", else dense.
    quantization: str | None = None
    # Decode-only steps of the native path replayed as CUDA graphs, one per batch and key-length
    # bucket (actors/runners/native/cuda_graphs.py). None: on when the model runs on CUDA;
    # False: off (`--no-cuda-graphs`); True on a CPU runs the same bucketed steps without
    # capture (how the CPU suite checks them; slower than the eager step there).
    cuda_graphs: bool | None = None
    # Plan a decode-only step while the one before it runs (actors/lookahead.py), so the device
    # goes from step to step without waiting for the event loop (docs/performance.md, "Async
    # scheduling": more tokens a second and fewer stalls at c=32, the same at c=1).
    async_scheduling: bool = True
    # The scheduler and the executor in a process of their own (actors/engine_process.py), so the
    # HTTP front end's Python never takes turns with the step's on one GIL.
    engine_process: bool = False
    # HTTP front ends on the one port (`--api-servers`), each its own process, all talking to
    # each model's one engine process (api/process/front_ends.py); more than 1 implies
    # engine_process. The command line's "auto" is `front_ends_for` this machine.
    api_servers: int = 1
    # Speculative decoding (SPEC_DECODING_MODES): "ngram" drafts from each request's own tokens
    # and from the n-grams finished requests wrote (actors/drafting.py); "draft" from
    # `draft_model` (a smaller Llama-family model with the target's tokenizer, run in the
    # runner: actors/runners/draft_model.py); "auto": the draft model when one is given, else
    # n-gram (`drafter()`); at most `num_spec_tokens` a step, verified in the packed step, as
    # many as the step cost fit says pay; "off": none. "auto" by default: it drafts only where
    # the runner's rows are invariant (a verify row's logits are the decode row's bit for bit,
    # so drafting changes no answer: docs/models.md "Same request, same answer"), 2.5x off at
    # c=1 and drafting nothing at c >= 8 (ops/results/spec-auto-vs-off-c1-c8-c32-rowwise-3rounds-2026-11-28-epyc-zen4.json).
    spec_decoding: str = "auto"
    num_spec_tokens: int = 4
    draft_model: str | None = None  # a local HF directory or a built-in name, as `model`
    # LoRA adapters (runtime/adapters.py, vLLM's flags): PEFT directories by the name requests
    # send as `model`, each applied per row on the native path; `max_loras` in a step at once
    # (slots filled on first use), `max_cpu_loras` read in host memory (None: all named at start).
    enable_lora: bool = False
    lora_modules: dict[str, str] = {}
    max_loras: int = 4
    max_cpu_loras: int | None = None
    max_lora_rank: int = 16
    lora_dir: str | None = None  # adapters may be loaded at run time from under it (/v1/load_lora_adapter); None: not at all
    # A vision-language model: images one prompt may carry (more is a 400 naming the part).
    limit_images_per_prompt: int = 8
    # A stream's tokens go to its client in chunks of at least this many, past the first token
    # and but for the last (runtime/mailbox.py says why: where steps take a few ms, the event
    # loop's cost a chunk bounds the server). 1: every token as it comes.
    stream_interval: int = 1
    # Reasoning models: how the model's thinking is read apart from its answer (runtime/reasoning.py).
    # "auto": from its chat template and tokenizer; "qwen3" / "deepseek_r1": that family's;
    # "none": never (the output is all answer).
    reasoning_parser: str = "auto"
    # Tool calls: the format the model writes them in (runtime/tool_formats.py `FORMATS`, vLLM's
    # --tool-call-parser names). "auto": the one its chat template teaches.
    tool_call_parser: str = "auto"
    # A chat template file replacing the model's own (runtime/chat_templates.py); None: the model's.
    chat_template: str | None = None
    # Sampling defaults for fields a request omits: "auto", the model's generation_config.json;
    # "none", the APIs' own (runtime/generation_defaults.py).
    generation_config: str = "auto"
    # Thinking budgets in tokens for reasoning_effort low/medium/high (the defaults: 512, 2048, 8192).
    reasoning_budgets: dict[str, int] = {}
    host: str = "127.0.0.1"
    port: int = 8000
    drain_timeout: float = 30.0
    step_deadline: float = 60.0  # /health turns 503 when one step runs longer than this
    log_level: str = "info"
    log_prompts: bool = False

    def stretch_for(self, reads_images: bool) -> float | None:
        """The step stretch in force for a model that does or does not read images ("auto":
        IMAGE_STEP_STRETCH or TEXT_STEP_STRETCH; None: the token budget alone)."""
        if self.step_stretch == "auto":
            return IMAGE_STEP_STRETCH if reads_images else TEXT_STEP_STRETCH
        return self.step_stretch

    def drafter(self, rowwise: bool = True) -> str:
        """What `spec_decoding` drafts with: "off", "ngram" or "draft". "auto": the draft model
        when one is given, else n-gram, where the runner computes rows alone (`rowwise`, the
        runner's ModelInfo: a verify row's logits are then the decode row's, so drafting
        changes no answer), else nothing; a mode given by name drafts anyway."""
        if self.spec_decoding == "auto":
            if not rowwise or self.batch_invariant is False:
                return "off"
            return "draft" if self.draft_model and not self.enable_lora else "ngram"
        return self.spec_decoding


CORES_PER_FRONT_END, MAX_FRONT_ENDS = 8, 4


def front_ends_for(engine_process: bool, cores: int) -> int:
    """`--api-servers auto`: one HTTP front end, or with the engine in its own process one per
    CORES_PER_FRONT_END cores (at most MAX_FRONT_ENDS), so a GPU host's cores share the HTTP
    work while a small machine keeps one (docs/performance.md: on 2 cores a second only takes
    turns). Provisional: the GPU check measures one and two."""
    return max(1, min(MAX_FRONT_ENDS, cores // CORES_PER_FRONT_END)) if engine_process else 1


def stretch_value(value: object) -> float | Literal["auto"] | None:
    """A step stretch as a flag or a config file gives it, as RuntimeConfig holds it: "auto";
    "off" is None; a finite number above 1 a float (a step is at least its decodes; inf or nan
    would overflow the prompt allowance). ValueError for anything else."""
    if value == "auto" or value == "off":
        return None if value == "off" else "auto"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 1:
        return float(value)
    raise ValueError(f"a step stretch is a finite number above 1, 'auto' or 'off', not {value!r}")
