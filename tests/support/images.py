"""Images for tests: small PNGs made in memory, data URIs, and a loopback HTTP image server.

`image_server` serves paths set by the test (`routes`: path -> (status, headers, body)) on
127.0.0.1 with a trio listener, and records every request it got (`hits`), so a test can show
that a refused fetch never reached it, or that a redirect's target was never asked for.
"""

from __future__ import annotations

import base64
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio


def png_bytes(width: int = 40, height: int = 30, seed: int = 0, mode: str = "RGB") -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    array = rng.randint(0, 256, (height, width, channels), dtype=np.uint8)
    image = Image.fromarray(array[:, :, 0] if channels == 1 else array, mode)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def pil_image(data: bytes):  # type: ignore[no-untyped-def]
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def huge_canvas_png(width: int = 30000, height: int = 30000) -> bytes:
    """A tiny PNG file whose header declares a huge canvas (a decompression bomb's shape)."""
    import struct
    import zlib

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


@dataclass
class ImageServer:
    port: int
    routes: dict[str, tuple[int, list[tuple[str, str]], bytes]] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


@asynccontextmanager
async def image_server() -> AsyncIterator[ImageServer]:
    import h11

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    server = ImageServer(port=listeners[0].socket.getsockname()[1])

    async def handle(stream: trio.SocketStream) -> None:
        conn = h11.Connection(our_role=h11.SERVER)
        async with stream:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Request):
                    path = event.target.decode()
                    server.hits.append(path)
                    status, headers, body = server.routes.get(path, (404, [], b"not found"))
                    all_headers = [("Content-Length", str(len(body))), *headers]
                    try:
                        await stream.send_all(conn.send(h11.Response(status_code=status, headers=all_headers)) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
                    except trio.BrokenResourceError:
                        pass
                    return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()
