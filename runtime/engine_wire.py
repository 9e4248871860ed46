"""What crosses between the front end and an engine process (`--engine-process`), and its framing.

Owns: the messages on the socket between the two (plain data: msgpack, never pickle) and their
length-prefixed frames. The front end sends new requests (a `TokenizedRequest` without its
grammar matcher, which the engine compiles from the guide the sampling parameters carry, and
without its mailbox, which stays in the front end), aborts, and the stop; the engine answers
once ready (its `ModelInfo`), to each adapter load or unload, then once per step with what the scheduler hands the
detokenizer (every request's new tokens, logprobs and finish reasons; the requests it dropped),
the step's size and time for the metrics, and now and then its scheduler's counters. A
vision model's requests carry numpy arrays (an image's processor outputs, M-RoPE positions):
they cross as msgpack extension values (dtype, shape, the bytes). Imports msgspec and numpy.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from runtime.messages import AbortReason, StepOutputs, TokenizedRequest
from runtime.protocol import ModelInfo

HEADER = 4  # bytes of a frame's length, little-endian
# How the front end hands the child its model's config (JSON) and its ends of the sockets (comma
# separated: the parent's first, then one per other front end, `--api-servers`); and how each
# other front end is handed its end for each model ({served name: fd}, JSON).
CONFIG_ENV, FD_ENV, ATTACH_ENV = "SWITCHYARD_ENGINE_CONFIG", "SWITCHYARD_ENGINE_FD", "SWITCHYARD_ENGINE_ATTACH"


def attach_key(config: Any) -> str:
    """How the front ends name a model's engine in `ATTACH_ENV` (each reads the same command line)."""
    return str(config.served_name or config.model or "")


class Submit(msgspec.Struct, tag="submit", frozen=True, gc=False):
    """front end → engine: a request and its siblings (n > 1), scheduled together or not at all."""

    requests: list[TokenizedRequest]


class Abort(msgspec.Struct, tag="abort", frozen=True, gc=False):
    request_id: str
    reason: AbortReason


class Stop(msgspec.Struct, tag="stop", frozen=True):
    """front end → engine: finish the step in flight, then exit."""


class AdapterCall(msgspec.Struct, tag="adapter", frozen=True):
    """front end → engine: load the LoRA adapter at `path` as `name` (None: unload it); answered by `AdapterDone`."""

    call: int
    name: str
    path: str | None = None


class AdapterDone(msgspec.Struct, tag="adapter_done", frozen=True):
    call: int
    error: str | None = None  # why it could not be loaded (ValueError's line)
    missing: bool = False  # unloading a name that is not loaded (KeyError)


class Ready(msgspec.Struct, tag="ready", frozen=True):
    info: ModelInfo
    counters: dict[str, int] = {}  # the scheduler's, idle


class Step(msgspec.Struct, tag="step", frozen=True, gc=False):
    """engine → front end: one step's outputs (None for a step that finished no request's
    tokens), the requests the scheduler dropped since the last message, the steps run since
    (tokens, seconds, failed) for the metrics, and the scheduler's counters when they are due."""

    outputs: StepOutputs | None = None
    dropped: list[str] = []
    steps: list[tuple[int, float, bool]] = []
    counters: dict[str, int] | None = None


class Failed(msgspec.Struct, tag="failed", frozen=True):
    """engine → front end, its last word: why it is going (a crash, or a model it cannot load)."""

    error: str
    refused: bool = False  # the model cannot be served right: the server should not start


ToEngine = Submit | Abort | Stop | AdapterCall
ToFront = Ready | Step | Failed | AdapterDone

_NDARRAY = 1  # msgpack extension code: a numpy array


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        array = np.ascontiguousarray(obj)
        header = msgspec.msgpack.encode((array.dtype.str, array.shape))
        return msgspec.msgpack.Ext(_NDARRAY, len(header).to_bytes(HEADER, "little") + header + array.tobytes())
    raise NotImplementedError(f"{type(obj).__name__} cannot cross to an engine process")


def _ext_hook(code: int, data: memoryview) -> Any:
    if code != _NDARRAY:
        raise ValueError(f"unknown msgpack extension {code}")
    size = int.from_bytes(data[:HEADER], "little")
    dtype, shape = msgspec.msgpack.decode(data[HEADER : HEADER + size])
    return np.frombuffer(data[HEADER + size :], dtype=np.dtype(dtype)).reshape(shape).copy()  # writable, its own memory


_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)


def frame(message: msgspec.Struct) -> bytes:
    body = _encoder.encode(message)
    return len(body).to_bytes(HEADER, "little") + body


class Frames:
    """Whole messages out of a byte stream that arrives in pieces."""

    def __init__(self, kind: Any) -> None:
        self._decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(kind, ext_hook=_ext_hook)
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[object]:
        self._buf += data
        out = []
        while len(self._buf) >= HEADER:
            size = int.from_bytes(self._buf[:HEADER], "little")
            if len(self._buf) < HEADER + size:
                break
            out.append(self._decoder.decode(self._buf[HEADER : HEADER + size]))
            del self._buf[: HEADER + size]
        return out
