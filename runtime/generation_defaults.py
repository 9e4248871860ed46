"""A model's own sampling defaults: `SamplingDefaults`, read from its generation_config.json
(`read_defaults`), for the fields a request leaves out (Llama 3.1 ships temperature 0.6 and
top_p 0.9, Qwen2.5 0.7 / 0.8 / top_k 20 / repetition_penalty 1.05). `--generation-config auto`
(the default) applies them, `none` keeps the APIs' own defaults (temperature and top_p 1, no
top_k, no penalty), as vLLM's `--generation-config vllm` does. /v1/models shows the ones in
force. Imports msgspec and the standard library.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

MODES = ("auto", "none")


class SamplingDefaults(msgspec.Struct, frozen=True, kw_only=True):
    """What a request that omits these fields gets; None: the API's own default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None

    def card(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__struct_fields__ if getattr(self, name) is not None}


def read_defaults(model_dir: Path | None, mode: str = "auto") -> SamplingDefaults:
    """The defaults of the model in `model_dir` under `mode`; none where the file has none."""
    if mode == "none" or model_dir is None:
        return SamplingDefaults()
    try:
        config = json.loads((Path(model_dir) / "generation_config.json").read_text())
    except (OSError, ValueError):
        return SamplingDefaults()
    if not isinstance(config, dict):
        return SamplingDefaults()

    def number(key: str, kind: type) -> Any:
        value = config.get(key)
        return kind(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    top_k = number("top_k", int)
    return SamplingDefaults(
        temperature=number("temperature", float),
        top_p=number("top_p", float),
        top_k=top_k if top_k is not None and top_k > 0 else None,
        repetition_penalty=number("repetition_penalty", float),
    )
