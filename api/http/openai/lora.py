"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's paths, bodies and answers):
LoRA adapters loaded and unloaded while the server runs, behind the API key as every route.

Owns the bodies and the checks at the edge: a model started with `--enable-lora` and
`--lora-dir`, a `lora_path` that resolves under that directory (links followed: nothing else
on the host is read), a `lora_name` no model or adapter has; then naming the adapter in the
registry once its engine has loaded it (`Runtime.load_adapter`, actors/lora_control.py), and
taking the name away before the engine unloads it. One load or unload at a time. Every refusal
is a 400 naming the field (an unknown adapter to unload: 404), nothing loaded.
Imports msgspec, quart, trio, api.http.shared and runtime.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import trio
from quart import Quart, Response

from api.http.shared.body import decode_body
from api.http.shared.routes import bind
from runtime.errors import InvalidRequest, ModelNotFound
from runtime.protocol import Runtime
from runtime.registry import ModelRegistry


class LoadLoRAAdapterRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    lora_name: str
    lora_path: str
    load_inplace: bool = False  # vLLM's: replace a loaded adapter of that name (not taken here)


class UnloadLoRAAdapterRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's; the name says which


def register(app: Quart, models: ModelRegistry) -> None:
    one_at_a_time = trio.Lock()

    async def load_lora_adapter() -> Response:
        req = await decode_body(LoadLoRAAdapterRequest)
        base, root = _base(models)
        path = _under(root, req.lora_path)
        if not req.lora_name.strip() or req.lora_name in {r.served_name for r in models.served()}:
            raise InvalidRequest(f"lora_name {req.lora_name!r}: empty, or a model or adapter is served under it already.", param="lora_name")
        if req.load_inplace:
            raise InvalidRequest("load_inplace is not supported: unload the adapter first.", param="load_inplace")
        async with one_at_a_time:
            try:
                await base.load_adapter(req.lora_name, str(path))
            except ValueError as exc:
                raise InvalidRequest(f"The adapter cannot be loaded: {exc}", param="lora_path") from None
            models.add_adapter(base, req.lora_name)
        return Response(f"Success: LoRA adapter '{req.lora_name}' added successfully.", status=200, content_type="text/plain")

    async def unload_lora_adapter() -> Response:
        req = await decode_body(UnloadLoRAAdapterRequest)
        async with one_at_a_time:
            try:
                base = models.remove_adapter(req.lora_name)
            except KeyError:
                raise ModelNotFound(req.lora_name) from None
            await base.unload_adapter(req.lora_name)
        return Response(f"Success: LoRA adapter '{req.lora_name}' removed successfully.", status=200, content_type="text/plain")

    bind(app, "load_lora_adapter", load_lora_adapter, LoadLoRAAdapterRequest)
    bind(app, "unload_lora_adapter", unload_lora_adapter, UnloadLoRAAdapterRequest)


def _base(models: ModelRegistry) -> tuple[Runtime, str]:
    """The model adapters load onto, and its --lora-dir."""
    base = models.lora_base()
    if base is None or not base.config.lora_dir:
        raise InvalidRequest("Adapters are not loaded at run time here: start the server with --enable-lora and --lora-dir.", param="lora_path")
    return base, base.config.lora_dir


def _under(root: str, path: str) -> Path:
    """`path` (absolute, or relative to `root`) resolved, links followed; a 400 unless it is
    inside `root`."""
    top = Path(os.path.realpath(root))
    found = Path(os.path.realpath(top / path))
    if found != top and top not in found.parents:
        raise InvalidRequest(f"lora_path {path!r} is not under the server's --lora-dir.", param="lora_path")
    return found
