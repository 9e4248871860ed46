"""system_fingerprint changes when the model, its weights or the engine's configuration change,
and only then."""

from __future__ import annotations

import shutil
from pathlib import Path

from actors.engine import Engine
from actors.runners.torch_runner import _weights_identity
from runtime.config import RuntimeConfig
from runtime.protocol import ModelInfo


def fingerprint(info_fp: str = "fp_runner", **config: object) -> str:
    runtime = Engine(RuntimeConfig(**config), runner=None, tokenizer=None, served_name="m", eos_token_ids=frozenset())  # type: ignore[arg-type]
    runtime.info = ModelInfo(max_model_len=512, vocab_size=320, device="cpu", dtype="float32", num_kv_blocks=64, block_size=4, fingerprint=info_fp)
    runtime.max_model_len = 512
    return runtime.fingerprint


def test_fingerprint_follows_the_engine_configuration() -> None:
    base = fingerprint()
    assert base.startswith("fp_") and base == fingerprint()
    assert fingerprint(max_num_batched_tokens=128) != base
    assert fingerprint(max_num_seqs=7) != base
    assert fingerprint(info_fp="fp_other_runner") != base  # weights, dtype, device, KV cache
    assert fingerprint(port=9999, log_level="debug") == base  # not about outputs


def test_new_weights_in_the_same_directory_change_the_identity(tiny_model_dir: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    before = _weights_identity(copy)
    assert _weights_identity(copy) == before
    weights = next(copy.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes() + b"\0")
    assert _weights_identity(copy) != before
