"""`SwitchyardIngress`: the deployment Ray's HTTP proxy sends every request to.

Owns the hop from HTTP to a model replica, and nothing of the API itself (routes, validation
and error shapes all run on the replica, in the one app):

1. read the body, and learn what routing needs before any replica sees it (`PromptHasher`):
   for a chat, completions or Responses body, the prompt's KV block chain hashes exactly as
   the replica's cache will compute them, on a worker thread so a long prompt never stalls the
   relays; and the `x-session-id` header;
2. call the replicas' `handle_http` through a streaming handle, with that `RoutingHint` as the
   `routing` keyword, which the request router (api/cluster/router.py) reads;
3. relay the replica's ASGI messages to the proxy as they arrive (api/cluster/edge.py, which
   also answers a failed replica with a clean error). The client leaving cancels this task,
   which cancels the replica's call, which aborts the request.

Deployed only on the relay topology (api/cluster/deploy.py): the one that routes by prompt.
Imports ray, transformers (tokenizers, processors), api, actors (multimodal) and runtime.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from api.cluster.edge import lifespan, read_body, relay
from api.cluster.host import HttpRequest, portable_scope
from api.cluster.settings import ClusterSpec
from api.http.openai.chat.params import chat_request
from api.http.openai.chat.request import ChatCompletionRequest
from api.http.openai.completions.params import completion_params
from api.http.openai.completions.request import CompletionRequest
from api.http.openai.responses.params import responses_params
from api.http.openai.responses.request import ResponsesRequest
from api.http.openai.tools.formats import FORMATS
from api.http.openai.tools.formats.base import ToolFormat
from api.http.openai.tools.parser import output_prefix
from api.http.platform.media import MediaPolicy
from api.http.shared.media.load import decode_data_uri
from api.http.shared.routes import match
from runtime.adapters import salt
from runtime.chat_templates import apply_template
from runtime.images import ImageInput, ImageRef
from runtime.logging import configure_logging, get_logger
from runtime.model_store import resolve_model, vision_model_type
from runtime.prefix_hash import block_hashes, keyed_token_ids
from runtime.prompt_encoding import encode_prompt
from runtime.reasoning import detect_thinking
from runtime.request import Prompt
from runtime.routing import RoutingHint
from runtime.tool_formats import detect_tool_format

log = get_logger("cluster.ingress")

SESSION_HEADER = b"x-session-id"
INGRESS_HEADER = b"x-switchyard-ingress"  # which ingress replica relayed the response
MAX_HASHED_BLOCKS = 512
RESPONSES_ROUTE = "create_response"  # api/http/shared/routes.py: its body is hashed as Responses builds it


# The prompt's token ids exactly as the replica's tokenizer actor will encode them (the replica's
# own params functions and runtime/prompt_encoding.py: the chat template with the request's
# tools and template kwargs), hashed into KV block chain hashes with the model's own block size
# (runtime/prefix_hash.py). A vision-language model's prompt with images goes through the
# model's own processor (actors/multimodal.py), each image's tokens keyed by its content hash
# (`keyed_token_ids`) as the replica's prefix cache keys them: a `data:` image is decoded here
# (Pillow, the hashing thread, the edge's pixel cap); an http(s) or file:// image is never
# fetched here (one fetch per image, on the replica, under its media policy), so the hashes stop
# before the first block holding such an image's tokens.
class PromptHasher:
    """Prompt -> KV block chain hashes, as the replica's cache will compute them: the body
    becomes the replica's own `Prompt` (each endpoint's params.py under api/http/openai/: the
    chat template's kwargs and tools, a forced tool call's output start) and is encoded by the
    replica's own code (runtime/prompt_encoding.py; a prompt with images, the model's processor
    through actors/multimodal.py), so routing and caching agree on every block."""

    def __init__(self, models: list[Any]) -> None:
        from transformers import AutoTokenizer

        self._models: dict[str, _Model] = {}
        self._default: _Model | None = None
        for config in models:
            if config.task == "embeddings":
                continue
            name, path = resolve_model(config.model, task=config.task)
            family = vision_model_type(path)
            images = None
            if family is not None:
                from actors.multimodal import ImagePrompts, load_processor

                processor = load_processor(path, family)
                apply_template(config.chat_template, processor)
                images = ImagePrompts(processor, family)
            tokenizer = AutoTokenizer.from_pretrained(path)
            apply_template(config.chat_template, tokenizer)
            thinking = detect_thinking(tokenizer, config.reasoning_parser, config.reasoning_budgets)
            fmt = FORMATS[detect_tool_format(tokenizer, config.tool_call_parser)](tokenizer)
            entry = _Model(tokenizer, config.block_size, images, thinking, fmt)
            self._models[config.served_name or name] = entry
            for adapter in config.lora_modules if config.enable_lora else ():  # its own chain (runtime/adapters.py salt)
                self._models[adapter] = msgspec.structs.replace(entry, root=salt(adapter))
            self._default = self._default or entry

    def hint(self, scope: dict[str, Any], body: bytes) -> RoutingHint | None:
        session = _header(scope, SESSION_HEADER)
        hashes: tuple[int, ...] = ()
        found = match(scope.get("method", ""), scope.get("path", ""))
        if found is not None and found[0].runs is not None:
            try:
                hashes = self.hashes(json.loads(body), responses=found[0].name == RESPONSES_ROUTE)
            except Exception:  # noqa: BLE001 - a bad body gets its 400 from the replica
                hashes = ()
        return RoutingHint(hashes, session) if hashes or session else None

    def hashes(self, doc: dict[str, Any], responses: bool = False) -> tuple[int, ...]:
        model = doc.get("model")
        entry = (self._models.get(model) if isinstance(model, str) else None) or self._default
        if entry is None:
            return ()
        found = request_prompt(doc, entry.tool_format, responses, entry.images is not None, entry.thinking)
        if found is None:
            return ()
        prompt, prefix, refs = found
        if not refs or entry.images is None:
            return tuple(block_hashes(encode_prompt(entry.tokenizer, prompt, prefix), entry.block_size, MAX_HASHED_BLOCKS, entry.root))
        ids, mm = entry.images.encode(msgspec.structs.replace(prompt, images=tuple(_routing_image(ref) for ref in refs)), prefix)
        keyed = keyed_token_ids(ids, mm)
        unfetched = [image.runs[0][0] for image, ref in zip(mm.images, refs) if not _inline(ref) and image.runs]
        return tuple(block_hashes(keyed[: min(unfetched)] if unfetched else keyed, entry.block_size, MAX_HASHED_BLOCKS, entry.root))


class _Model(msgspec.Struct, frozen=True):
    tokenizer: Any
    block_size: int
    images: Any = None  # actors.multimodal.ImagePrompts for a vision-language model
    thinking: Any = None  # runtime.reasoning.ThinkingFormat for a reasoning model (its effort changes the prompt)
    tool_format: Any = None  # its tool-call format (api/http/openai/tools/formats/): how tools and calls are rendered
    root: int | None = None  # a LoRA adapter's: where its prefix chain starts, as the replica's cache starts it


_STAND_IN = ImageInput(width=28, height=28, pixels=bytes(28 * 28 * 3), hash="0" * 64)


def _inline(ref: ImageRef) -> bool:
    return ref.url.strip()[:5].lower() == "data:"


def _routing_image(ref: ImageRef) -> ImageInput:
    """A `data:` image decoded as the edge decodes it (the same content hash); any other
    image (never fetched here) a stand-in whose tokens the hashes stop before."""
    if not _inline(ref):
        return _STAND_IN
    return decode_data_uri(ref, MediaPolicy())


def request_prompt(
    doc: dict[str, Any], fmt: ToolFormat | None, responses: bool = False, takes_images: bool = False, thinking: Any = None
) -> tuple[Prompt, str, tuple[ImageRef, ...]] | None:
    """The `Prompt` a replica will encode for a chat, completions or (`responses`: the route
    says so, since an embeddings body has an `input` too) Responses body, the output start
    its guide puts after it (`Guide.prefix`), and its image parts (`takes_images`: a
    vision-language model's), built by the replica's own params functions (`thinking`: a
    reasoning model's format, which its effort turns into template kwargs)."""
    if responses:
        params = responses_params(_struct(ResponsesRequest, doc), fmt, takes_images, thinking)
        return params.prompt, output_prefix(params.sampling), params.images
    if isinstance(doc.get("messages"), list):
        chat = chat_request(_struct(ChatCompletionRequest, doc), fmt, takes_images, thinking)
        return chat.prompt, output_prefix(chat.sampling), chat.images
    if "prompt" in doc:
        prompts, _ = completion_params(_struct(CompletionRequest, doc))
        return prompts[0], "", ()  # a batch's first prompt routes it
    return None


def _struct(kind: Any, doc: dict[str, Any]) -> Any:
    """`doc` as the OpenAI struct `kind`, without the fields it lacks (Azure's and
    Databricks' bodies carry their own; the replica checks those)."""
    return msgspec.convert({k: v for k, v in doc.items() if k in kind.__struct_encode_fields__}, kind)


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class SwitchyardIngress:
    """Wrapped by `serve.ingress()` in api/cluster/deploy.py; its ASGI app is `asgi`."""

    def __init__(self, replicas: Any, spec: ClusterSpec) -> None:
        from ray import serve

        configure_logging(spec.log_level)  # a Ray worker process: structlog's defaults until now
        self._id = serve.get_replica_context().replica_id.unique_id.encode()
        self._replicas = replicas.options(stream=True)
        self._hasher = PromptHasher(spec.models) if spec.settings.router == "prefix" else None
        # One thread: a fast tokenizer shared across threads can refuse ("Already borrowed").
        self._hashing = ThreadPoolExecutor(1, thread_name_prefix="prompt-hash")

    def __serve_build_asgi_app__(self) -> Any:
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:  # a plain function:
            await self.asgi(scope, receive, send)  # uvicorn takes a bound method for ASGI2

        return app

    async def asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets: no route takes them
        body = await read_body(receive)
        hint = None
        if self._hasher is not None:
            hint = await asyncio.get_running_loop().run_in_executor(self._hashing, self._hasher.hint, scope, body)
        request = HttpRequest(portable_scope(scope), body)
        responses = self._replicas.handle_http.remote(request, routing=hint)
        await relay(responses, scope, send, [(INGRESS_HEADER, self._id)], on_cancel=responses.cancel)
