"""Keeping the server's resident memory flat: `trim_heap()` and `bound_native_caches()`; and its
garbage collector off the streams' path: `freeze_startup_heap()`.

Why: a step allocates tensors of many sizes (logits, activations of prefill chunks of any
length). glibc raises its mmap threshold after a large buffer is freed, so later ones come
from the heap arenas, and the freed space between live chunks is kept, not returned. A
10-minute soak (ops/load/soak.py, 6 clients) grew the server's resident memory by 20% that way,
still climbing. Pinning the threshold instead (MALLOC_MMAP_THRESHOLD_=128K) flattened it but
cost 45% of throughput at c=32 (every large buffer mmapped and faulted in again). malloc_trim
releases the free pages inside every arena (madvise), keeps the allocator's fast path, and
takes a few milliseconds; the executor calls it between steps at most every few seconds.
A no-op where the C library is not glibc.

oneDNN (torch's CPU matmuls) compiles and caches a kernel per new shape, 1024 by default; a
step's token count and attention lengths vary, so the cache kept filling: ~300 MiB of the
server's memory, still growing after a minute of load. `bound_native_caches()` caps it at 256
before torch starts (unless the operator set ONEDNN_PRIMITIVE_CACHE_CAPACITY): 64 entries cost
4% of c=32 throughput here, 256 is between.

Python's cyclic collector walks every tracked object in a full (generation 2) collection, and
a server with torch and transformers loaded holds millions: one full collection took 196 ms in
the vision bench's server (2026-11-26, Xeon; gc callbacks timed it), with the GIL held, so
every stream's next token waited that long. `freeze_startup_heap()`, once the models are loaded
and warm, moves everything alive then into the permanent generation, which collections skip
(vLLM does the same at the end of its warm-up; SGLang offers it as a call); what requests
allocate later is collected as before. Graphs compiled in the background after that (inductor's
and dynamo's objects, hundreds of thousands) made a full collection 430-626 ms again; one of
them stalled a 64-row step four times over, in step with every stream after a burst, the p99
gap of a c=64 level (docs/performance.md, "A burst of arrivals in one step"). So the compile
thread calls `refreeze_heap()` when its last graph is in: it freezes again, where the startup
froze (a test's in-process server never froze, and does not then).
Imports gc, os, ctypes and runtime.logging.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from collections.abc import Callable

from runtime.logging import get_logger

_trim: Callable[[int], int] | None = None
try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    _trim = _libc.malloc_trim
    _trim.argtypes = [ctypes.c_size_t]
    _trim.restype = ctypes.c_int
except (OSError, AttributeError):  # not glibc
    _trim = None


def trim_heap() -> bool:
    """Give free heap pages back to the OS; True when glibc says it released any."""
    return bool(_trim(0)) if _trim is not None else False


ONEDNN_CACHE_ENTRIES = "256"


def bound_native_caches() -> None:
    """Call before torch is imported: oneDNN reads its cache size once."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_CACHE_ENTRIES)


def freeze_startup_heap(reason: str = "startup") -> int:
    """Collect once, then keep every object alive now out of later collections; how many
    (logged as `heap_frozen`)."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    get_logger("memory").info("heap_frozen", objects=frozen, reason=reason)
    return frozen


def refreeze_heap(reason: str) -> int | None:
    """Freeze again what was built since (module docstring), where the startup froze; else None."""
    return freeze_startup_heap(reason) if gc.get_freeze_count() else None
