"""The `switchyard` command line: its two subcommands and every flag, parsed into a `CommandLine`.

Owns: the flags (each says what it does and its default), turning them into the CLI's
`RuntimeConfig` (every per-model flag is named as its field) and keeping the rest (the config
file's path, `--no-embeddings`, serve-ray's and the platform's flags) on the namespace. A bad
value is argparse's usage error: one line naming the flag, exit 2.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from typing import Literal

from api.http.platform import config as platform_config
from runtime.adapters import parse_module
from runtime.config import IMAGE_STEP_STRETCH, SPEC_DECODING_MODES, TEXT_STEP_STRETCH, RuntimeConfig, front_ends_for, stretch_value
from runtime.generation_defaults import MODES as GENERATION_MODES
from runtime.reasoning import PARSERS as REASONING_PARSERS
from runtime.tool_formats import PARSERS as TOOL_PARSERS

DEFAULTS = RuntimeConfig()  # one place for every default: the CLI shows the same ones


@dataclass(frozen=True)
class CommandLine:
    """The parsed command: `config` holds the per-model flags, `args` everything argparse read."""

    config: RuntimeConfig
    args: argparse.Namespace

    @property
    def command(self) -> str:
        return str(self.args.command)


def parse_args(argv: list[str] | None = None) -> CommandLine:
    parser = argparse.ArgumentParser(prog="switchyard", description="Switchyard LLM serving runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="serve a model over HTTP")
    _add_serve_arguments(p)
    ray = sub.add_parser("serve-ray", help="serve the same API from replicas on Ray Serve (needs the ray extra)")
    _add_serve_arguments(ray)
    _add_cluster_arguments(ray)
    args = parser.parse_args(argv)
    return CommandLine(config=_runtime_config(args), args=args)


def _add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """serve-ray's own flags; each overrides the config file's [cluster] table (api/cluster/settings.py)."""
    p.add_argument("--address", default=None, help="a running Ray cluster to join (default: start a local Ray instance)")
    p.add_argument("--replicas", type=int, default=None, help="model replicas (default 1)")
    p.add_argument("--ingress-replicas", type=int, default=None, help="HTTP ingress replicas (default 1)")
    p.add_argument("--replica-cpus", type=float, default=None, help="Ray CPUs reserved per model replica (default 1)")
    p.add_argument("--router", choices=["prefix", "pow2"], default=None, help="prefix-aware routing (default) or Ray's power of two choices")
    p.add_argument(
        "--topology", choices=["auto", "direct", "relay"], default=None,
        help="direct: Ray's proxy calls the replicas (one hop fewer; no prefix routing); relay: through the ingress; "
        "auto (default): direct for pow2 or one replica",
    )  # fmt: skip


def _add_process_arguments(p: argparse.ArgumentParser) -> None:
    """Which processes serve: the engine's own, and how many HTTP front ends."""
    p.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=DEFAULTS.engine_process, help="run each generation model's scheduler and executor in a process of their own, which the server talks to over a socket, so the HTTP front end's Python never takes turns with the step's on one GIL (default off)")
    p.add_argument("--api-servers", type=_servers, default="auto", help="HTTP front ends serving the one port, each a process of its own talking to each model's one engine process (more than 1 implies --engine-process; not yet with --lora-dir's run-time adapters); rate limits, serving endpoints and /metrics are shared by all (default auto: 1, or with --engine-process and no --lora-dir one per 8 cores, at most 4)")


def _add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="a local Hugging Face model directory, a GGUF file (llama, mistral, qwen2, qwen3; converted once into the model store), or a built-in name (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--served-name", default=None, help="the name clients send as `model` (default: the model's own name)")
    p.add_argument("--host", default=DEFAULTS.host, help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULTS.port, help="port to listen on (default %(default)s)")
    p.add_argument("--device", default=None, help="cuda, cpu, cuda:1, ... (default: cuda when available, else cpu)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="weights and KV cache dtype (default auto: bfloat16 on CUDA and on CPUs with native bf16, else float32)")
    p.add_argument("--kv-cache-gib", type=_gib, default=DEFAULTS.kv_cache_gib, help="memory for the paged KV cache, in GiB (default: from --memory-utilization)")
    p.add_argument("--num-kv-blocks", type=int, default=None, help="KV cache blocks, overriding --kv-cache-gib (default: from --kv-cache-gib)")
    p.add_argument("--memory-utilization", type=_fraction, default=DEFAULTS.memory_utilization, help="the share of the device's memory this process may use (vLLM's --gpu-memory-utilization): the KV cache gets what the weights and a step's work leave of it, up to what --max-num-seqs sequences of the whole context use, at least 1 GiB where free; several models in one process split it (default: 0.9 of a GPU, 0.5 of a CPU host's memory or cgroup limit)")
    p.add_argument("--block-size", type=int, default=DEFAULTS.block_size, help="tokens per KV cache block, the prefix cache's unit (default %(default)s)")
    p.add_argument("--max-num-seqs", type=int, default=DEFAULTS.max_num_seqs, help="requests running in one step at most (default %(default)s)")
    p.add_argument("--max-num-batched-tokens", type=int, default=DEFAULTS.max_num_batched_tokens, help="tokens per step at most: decodes plus prompt chunks (default %(default)s)")
    p.add_argument("--step-stretch", type=_stretch, default=DEFAULTS.step_stretch, help="while requests stream, a step carries prompt chunks worth at most (this - 1) x its decodes' own time, measured as the engine runs, so a stream's gap between chunks stays within this x a decode step ('off': the token budget alone; auto: " f"{TEXT_STEP_STRETCH}, or {IMAGE_STEP_STRETCH} for a model that reads images, whose long image prompts put a chunk in nearly every step; default %(default)s)")
    p.add_argument("--max-prompt-chunks", type=_chunks, default=DEFAULTS.max_prompt_chunks, help="while requests stream, the most prompt chunks one step carries (default auto: one where the runner compiles steps of one chunk beside the decodes and runs others eager, else any)")
    p.add_argument("--burst-tokens", type=_whole, default=DEFAULTS.burst_tokens, help="when prompts waiting to start outnumber the streams 4 to 1, one step starts them all, up to this many tokens, each chunk at most --max-num-batched-tokens: the streams beside them wait once, and the burst runs as one batch (0: never; default %(default)s)")
    p.add_argument("--max-model-len", type=int, default=None, help="context length in tokens, prompt plus output (default: the model's, capped by the KV cache)")
    p.add_argument("--max-pending", type=int, default=DEFAULTS.max_pending, help="admitted, unfinished requests; past this a 429 (default %(default)s)")
    p.add_argument("--limit-images-per-prompt", type=int, default=DEFAULTS.limit_images_per_prompt, help="a vision-language model: images one prompt may carry, more is a 400 (default %(default)s)")
    p.add_argument(
        "--stream-interval", type=_positive_int, default=DEFAULTS.stream_interval,
        help="streamed tokens go out in chunks of at least this many, past the first (default %(default)s: each as it comes); more trades smoothness for throughput where steps are short",
    )  # fmt: skip
    p.add_argument("--max-pending-tokens", type=int, default=None, help="estimated prompt + max_tokens of admitted requests; past this a 429 (default: no limit)")
    p.add_argument("--step-deadline", type=float, default=DEFAULTS.step_deadline, help="/health turns 503 while one step runs longer than this, in seconds (default %(default)s)")
    p.add_argument("--num-threads", type=int, default=None, help="torch intra-op threads (default: torch's, every core)")
    p.add_argument("--drain-timeout", type=float, default=DEFAULTS.drain_timeout, help="on SIGTERM, seconds in-flight requests get to finish (default %(default)s)")
    p.add_argument("--log-level", default=DEFAULTS.log_level, choices=["debug", "info", "warning", "error"], help="log level of the JSON log lines (default %(default)s)")
    p.add_argument("--config", default=None, help="a TOML file with [[models]], [[endpoints]], [platform] and [cluster] tables (docs/operations.md; default: none)")
    p.add_argument("--no-embeddings", action="store_true", help="do not also serve the default embedding model (default: served beside the chat model)")
    p.add_argument("--log-prompts", action="store_true", help="log request bodies and generated text (default: never logged)")
    p.add_argument(
        "--batch-invariant",
        action=argparse.BooleanOptionalAction,
        default=DEFAULTS.batch_invariant,
        help="a request's tokens and logprobs never depend on the batch or the step it rides in (default: on where the row-invariant kernels serve, the native path on a CPU in bf16; --batch-invariant also elsewhere, as fixed 32-row matmul blocks, slower; --no-batch-invariant: never)",
    )
    p.add_argument("--model-impl", default=DEFAULTS.model_impl, choices=["auto", "native", "transformers"], help="model code: native (Llama, Mistral, Qwen2, Qwen3), transformers (any causal LM), auto: native when supported (default %(default)s)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=DEFAULTS.compile, help="torch.compile the native path's single-stream decode step on a background thread: the eager step serves at once and the graph is swapped in when ready (minutes the first time on a small CPU, inductor's disk cache after; default: on for the native path on a CPU off the row-invariant kernels, which it would round otherwise; --no-compile: eager only)")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_const", const=False, default=None, help="on a GPU, run decode steps eager instead of replaying one captured CUDA graph per batch and key-length bucket (native path; default: graphs on CUDA)")
    _add_process_arguments(p)
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=DEFAULTS.async_scheduling, help="plan each decode-only step while the one before it runs, so the device never waits for the event loop between them (default on; --no-async-scheduling: the serial step)")
    p.add_argument("--spec-decoding", default=DEFAULTS.spec_decoding, choices=SPEC_DECODING_MODES, help="speculative decoding: ngram drafts each request's next tokens from its own prompt and output, and from what finished requests wrote; draft from --draft-model; auto: the draft model when one is given, else ngram, where the runner's rows are invariant (then drafting changes no token), else none; the step verifies the drafts, as many as the measured step cost says pay (default %(default)s)")
    p.add_argument("--draft-model", default=None, help="with --spec-decoding draft or auto: a smaller Llama-family model with the target's tokenizer (a local Hugging Face directory or a built-in name) that drafts greedily on the device beside the target, in its own KV cache on the same blocks (default: none)")
    p.add_argument("--num-spec-tokens", type=int, default=DEFAULTS.num_spec_tokens, help="the most draft tokens a request verifies in one step; how many it drafts follows the step cost fit and its acceptance (default %(default)s)")
    p.add_argument(
        "--quantization", default=None, choices=["none", "int8", "int4", "shipped"],
        help="linears on the native path (CPU): shipped serves the checkpoint's own quantized blocks (the embedded SmolLM2's Q4_1) as they are, "
        "none the dense weights; int8/int4 requantize the dense weights, with weight-only kernels up to 4 rows and an int8 GEMM on per-row "
        "quantized activations past that (the one setting that quantizes activations) (default: shipped where the checkpoint ships quantized "
        "weights and --dtype is not given, else none)",
    )  # fmt: skip
    p.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters (PEFT directories) beside the base model, each chosen by the request's `model` and applied per row, so requests for several adapters and the base share a step (native path; default off)")
    p.add_argument("--lora-modules", nargs="+", action="extend", type=parse_module, default=[], metavar="NAME=DIR", help="with --enable-lora: adapters to serve, each as the name requests send as `model` and its PEFT directory (default: no adapters)")
    p.add_argument("--max-loras", type=_positive_int, default=DEFAULTS.max_loras, help="adapters in one step's slots at once: a slot is filled on an adapter's first use, the least recently used out; a request for one more waits for a slot (default %(default)s)")
    p.add_argument("--max-cpu-loras", type=_positive_int, default=None, help="adapters kept in host memory once read, the least recently used out (read from their directory again when next wanted); at least --max-loras (default: every adapter named at start, at least --max-loras)")
    p.add_argument("--lora-dir", default=None, help="with --enable-lora: adapters may be loaded and unloaded while serving (POST /v1/load_lora_adapter, /v1/unload_lora_adapter, behind the API key), from directories under this one only (default: not at run time)")
    p.add_argument("--max-lora-rank", type=_positive_int, default=DEFAULTS.max_lora_rank, help="the largest adapter rank served (default %(default)s)")
    _add_output_arguments(p)
    platform_config.add_arguments(p)


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    """How the model's prompt is written and its output read: its template, thinking, tool calls."""
    p.add_argument(
        "--chat-template", default=None,
        help="a Jinja chat template file used instead of the model's own (its tool-call and thinking formats are read from it) "
        "(default: the model's)",
    )  # fmt: skip
    p.add_argument(
        "--generation-config", default=DEFAULTS.generation_config, choices=list(GENERATION_MODES),
        help="sampling defaults for the fields a request leaves out: auto, the model's generation_config.json (temperature, "
        "top_p, top_k, repetition_penalty); none, the APIs' own (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--reasoning-parser", default=DEFAULTS.reasoning_parser, choices=list(REASONING_PARSERS),
        help="how a reasoning model's thinking is read apart from its answer: auto from its chat template, a family's format, "
        "or none (all output is answer) (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--tool-call-parser", default=DEFAULTS.tool_call_parser, choices=list(TOOL_PARSERS),
        help="the format the model writes tool calls in (vLLM's names): auto, the one its chat template teaches, or a family's "
        "(default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--reasoning-budgets", type=_budgets, default={},
        help="thinking budgets in tokens for reasoning_effort low, medium, high, as low=512,medium=2048,high=8192 (default: those)",
    )  # fmt: skip


def _whole(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be at least 0")
    return value


def _positive_int(text: str) -> int:
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _fraction(text: str) -> float:
    value = _number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError("must be above 0 and at most 1")
    return value


def _gib(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be above 0")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError("must be finite")
    return value


def _servers(text: str) -> int | str:
    return "auto" if text == "auto" else _positive_int(text)


def _chunks(text: str) -> int | None:
    return None if text == "auto" else _positive_int(text)


def _stretch(text: str) -> float | Literal["auto"] | None:
    try:
        return stretch_value(text if text in ("off", "auto") else float(text))
    except ValueError:
        raise argparse.ArgumentTypeError("must be a finite number above 1 (a step is at least its decodes), 'auto' or 'off'") from None


def _budgets(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name.strip() not in ("low", "medium", "high") or not value.strip().isdigit():
            raise argparse.ArgumentTypeError(f"{item!r}: expected low=N, medium=N or high=N")
        out[name.strip()] = int(value)
    return out


def _runtime_config(args: argparse.Namespace) -> RuntimeConfig:
    # Every per-model flag is named as its RuntimeConfig field (task comes from the config file).
    values = {name: getattr(args, name) for name in RuntimeConfig.__struct_fields__ if hasattr(args, name)}
    values["lora_modules"] = dict(values.get("lora_modules") or [])  # NAME=DIR pairs
    if values.get("api_servers") == "auto":
        values["api_servers"] = front_ends_for(bool(values.get("engine_process")) and not values.get("lora_dir"), os.cpu_count() or 1)  # run-time adapters: one front end
    return RuntimeConfig(**values)
