"""POST /v1/embeddings (the Databricks Foundation Model API's Embeddings API; the OpenAI shape):
the request struct, the `list` of `embedding`s it answers, and the view.

Every input of a request is one sequence through the embedding runtime's actors (tokenizer,
scheduler, executor), submitted together so they share a device step. `instruction` is
prepended to each input, the way instruction-following embedders (BGE, Instructor) expect.
`respond` is also what Databricks' embeddings invocations answer with. Imports msgspec, quart,
api.http.shared, api.http.openai.common and runtime.
"""

from __future__ import annotations

import base64
import struct
import time
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta
from quart import Quart, Response

from api.http.openai.common.generation import Generation
from api.http.shared.body import decode_body
from api.http.shared.errors import json_response
from api.http.shared.routes import bind
from runtime.errors import InvalidRequest
from runtime.registry import ModelRegistry
from runtime.request import Prompt
from runtime.sampling import SamplingParams

MAX_INPUTS = 2048


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    input: str | list[str | Annotated[int, Meta(ge=0)] | list[Annotated[int, Meta(ge=0)]]]
    model: str | None = None
    instruction: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: str | None = None


class Embedding(msgspec.Struct, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # floats, or base64 of little-endian float32s


class EmbeddingUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage


def _prompts(req: EmbeddingRequest) -> list[Prompt]:
    items: list[Any]
    if isinstance(req.input, str):
        items = [req.input]
    elif req.input and all(isinstance(i, int) for i in req.input):
        items = [list(req.input)]  # one token-id input
    else:
        items = list(req.input)
    if not items:
        raise InvalidRequest("input must not be empty.", param="input")
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(f"At most {MAX_INPUTS} inputs per request.", param="input")
    prompts = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            if not item:
                raise InvalidRequest("Inputs must not be empty strings.", param=f"input[{i}]")
            text = item
            if req.instruction:
                separator = "" if req.instruction.endswith((" ", "\n")) else " "
                text = req.instruction + separator + item
            prompts.append(Prompt(text=text))
        elif isinstance(item, list) and item:
            if req.instruction:
                raise InvalidRequest("instruction needs text inputs, not token ids.", param="instruction")
            prompts.append(Prompt(token_ids=item))
        else:
            raise InvalidRequest("Each input must be a non-empty string or token-id list.", param=f"input[{i}]")
    return prompts


def _check_dimensions(dimensions: int | None, size: int | None) -> None:
    """Before the model runs: `dimensions` must be the model's own vector length (vectors are
    not shortened), which the runner reports when it loads."""
    if dimensions is not None and dimensions != size:
        what = f"returns {size}-dimensional embeddings" if size is not None else "does not report its embedding size"
        raise InvalidRequest(f"This model {what} and cannot shorten them to {dimensions}.", param="dimensions")


async def respond(models: ModelRegistry, req: EmbeddingRequest) -> Response:
    runtime = models.resolve(req.model, task="embed")
    prompts = _prompts(req)
    _check_dimensions(req.dimensions, runtime.info.embedding_size if runtime.info is not None else None)
    gen = await Generation(runtime, prompts, SamplingParams(max_tokens=0)).start()
    outs = await gen.collect()
    data: list[Embedding] = []
    for index, out in enumerate(outs):
        vector = out.embedding or []
        encoded: list[float] | str = vector
        if req.encoding_format == "base64":
            encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append(Embedding(index=index, embedding=encoded))
    prompt_tokens = sum(out.usage.prompt_tokens for out in outs if out.usage)
    usage = EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
    body = EmbeddingList(id=f"embd-{gen.request_id}", created=int(time.time()), model=runtime.served_name, data=data, usage=usage)
    return json_response(body)


def register(app: Quart, models: ModelRegistry) -> None:
    async def embeddings() -> Response:
        return await respond(models, await decode_body(EmbeddingRequest))

    bind(app, "embeddings", embeddings, EmbeddingRequest)
