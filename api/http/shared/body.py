"""Request bodies: the one place a body is read, logged and decoded.

Owns: reading a view's body (and logging it with --log-prompts only: bodies hold user data),
decoding it with msgspec into a surface's struct (decoders cached per struct) or into a plain
JSON object (for surfaces that look at the fields before choosing a struct), and turning a
msgspec error into an InvalidRequest whose `param` is the JSON path of the bad field.
Imports msgspec, quart, api.http.shared and runtime.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
from quart import current_app, request

from api.http.shared.edge import note_model
from runtime.errors import InvalidRequest
from runtime.logging import get_logger

log = get_logger("api")
T = TypeVar("T")

_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}
_PATH = re.compile(r" - at `\$\.?(.*)`$")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def from_decode_error(exc: msgspec.DecodeError) -> InvalidRequest:
    """A msgspec error → InvalidRequest whose param is the JSON path of the bad field."""
    text = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        return InvalidRequest(f"The request body is not valid JSON: {text}", param=None, code="invalid_json")
    param = None
    if (m := _PATH.search(text)) is not None:
        param = m.group(1) or None
    if (m := _MISSING.search(text)) is not None:
        param = f"{param}.{m.group(1)}" if param else m.group(1)
    return InvalidRequest(f"Invalid request: {text}", param=param, code="invalid_value")


async def read_body() -> bytes:
    body = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    if current_app.config.get("LOG_PROMPTS"):  # --log-prompts only: bodies hold user data
        log.info("request_body", body=body[:8192].decode(errors="replace"))
    return body


def decode(body: bytes, schema: type[T]) -> T:
    decoder = _decoders.get(schema)
    if decoder is None:
        decoder = _decoders[schema] = msgspec.json.Decoder(schema)
    try:
        decoded: T = decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise from_decode_error(exc) from None
    except UnicodeDecodeError:  # a JSON string holding bytes that are not UTF-8 (found by the fuzz: it was a 500)
        raise InvalidRequest("The request body is not valid JSON: it is not UTF-8 text.", param=None, code="invalid_json") from None
    return decoded


def convert(fields: dict[str, Any], schema: type[T]) -> T:
    """Fields already decoded as JSON (`decode_object`) → `schema`, errors as `decode`'s."""
    try:
        return msgspec.convert(fields, schema)
    except msgspec.ValidationError as exc:
        raise from_decode_error(exc) from None


def decode_object(body: bytes) -> dict[str, Any]:
    fields = decode(body, object)
    if not isinstance(fields, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    return fields


async def decode_body(schema: type[T]) -> T:
    """The view's body as `schema`; the model it names labels the request's metrics."""
    decoded = decode(await read_body(), schema)
    model = getattr(decoded, "model", None)
    note_model(model if isinstance(model, str) else None)
    return decoded
