"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's paths, bodies and answers):
LoRA adapters loaded and unloaded while the server runs, behind the API key as every route.

Owns the bodies and the checks at the edge: a model started with `--enable-lora` and
`--lora-dir`, a `lora_path` that resolves under that directory (links followed: nothing else
on the host is read), a `lora_name` no model or adapter has; then naming the adapter in the
registry once its engine has loaded it (`Runtime.load_adapter`, actors/lora_control.py), and
taking the name away before the engine unloads it. One load or unload at a time. Every refusal
is a 400 naming the field (an unknown adapter to unload: 404), nothing loaded. On serve-ray a
load or unload reaches every replica before the answer (`RunTimeAdapters.adopt`).
Imports msgspec, quart, trio, api.http.shared and runtime.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
import trio
from quart import Quart, Response

from api.http.shared.body import decode_body
from api.http.shared.routes import bind
from runtime.errors import InvalidRequest, ModelNotFound
from runtime.logging import get_logger
from runtime.protocol import Runtime
from runtime.registry import ModelRegistry

log = get_logger("api.lora")


class LoadLoRAAdapterRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    lora_name: str
    lora_path: str
    load_inplace: bool = False  # vLLM's: replace a loaded adapter of that name (not taken here)


class UnloadLoRAAdapterRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's; the name says which


class RunTimeAdapters:
    """The adapters loaded while serving, one load or unload at a time: by the routes, and on a
    serve-ray replica by `adopt` from the deployment's shared list (api/cluster/config_store.py;
    the routes publish each change to it through the platform's `adapter_sync`)."""

    def __init__(self, models: ModelRegistry) -> None:
        self.models = models
        self.loaded: dict[str, str] = {}  # name → the path it was loaded from, at run time
        self._one_at_a_time = trio.Lock()

    async def load(self, name: str, lora_path: str) -> None:
        """Check, load and name it (a 400 naming the field, nothing loaded, when it cannot be)."""
        base, root = _base(self.models)
        path = _under(root, lora_path)
        if not name.strip() or name in {r.served_name for r in self.models.served()}:
            raise InvalidRequest(f"lora_name {name!r}: empty, or a model or adapter is served under it already.", param="lora_name")
        async with self._one_at_a_time:
            try:
                await base.load_adapter(name, str(path))
            except ValueError as exc:
                raise InvalidRequest(f"The adapter cannot be loaded: {exc}", param="lora_path") from None
            self.models.add_adapter(base, name)
            self.loaded[name] = lora_path

    async def unload(self, name: str) -> None:
        """Take the name away, end its requests, free it (a 404 when no adapter has that name)."""
        async with self._one_at_a_time:
            try:
                base = self.models.remove_adapter(name)
            except KeyError:
                raise ModelNotFound(name) from None
            self.loaded.pop(name, None)
            await base.unload_adapter(name)

    async def adopt(self, shared: dict[str, str]) -> None:
        """Load what another replica loaded and unload what it unloaded (`shared`: every
        run-time adapter of the deployment, name → path); a failure is logged, the rest go on."""
        for name in [n for n in self.loaded if n not in shared]:
            await self._quietly(self.unload, name)
        for name, path in shared.items():
            if self.loaded.get(name) != path:
                if name in self.loaded:
                    await self._quietly(self.unload, name)
                await self._quietly(self.load, name, path)

    async def _quietly(self, change: Any, *args: str) -> None:
        try:
            await change(*args)
        except (InvalidRequest, ModelNotFound) as exc:
            log.warning("shared_adapter_not_applied", change=change.__name__, adapter=args[0], error=str(exc))


def register(app: Quart, models: ModelRegistry) -> None:
    """The two routes; the platform's `adapter_sync` (a serve-ray replica's) publishes each change."""
    sync = getattr(app.extensions.get("platform_config"), "adapter_sync", None)
    adapters = app.extensions["lora_adapters"] = RunTimeAdapters(models)

    async def load_lora_adapter() -> Response:
        req = await decode_body(LoadLoRAAdapterRequest)
        if req.load_inplace:
            raise InvalidRequest("load_inplace is not supported: unload the adapter first.", param="load_inplace")
        await adapters.load(req.lora_name, req.lora_path)
        if sync is not None:  # every replica loads it before the answer
            await sync.publish(req.lora_name, req.lora_path)
        return Response(f"Success: LoRA adapter '{req.lora_name}' added successfully.", status=200, content_type="text/plain")

    async def unload_lora_adapter() -> Response:
        req = await decode_body(UnloadLoRAAdapterRequest)
        await adapters.unload(req.lora_name)
        if sync is not None:
            await sync.publish(req.lora_name, None)
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
