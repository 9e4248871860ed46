"""Keeping the server's resident memory flat, and its garbage collector off the streams' path.

Owns: `trim_heap()`, which gives the heap arenas' free pages back to the OS between steps
(glibc keeps the freed space between live chunks, so resident memory climbed under load);
`bound_native_caches()`, which caps oneDNN's per-shape kernel cache (step shapes vary, so it
kept filling); and `freeze_startup_heap()` / `refreeze_heap()`, which move everything alive once
the models are warm (and again once background compiles are in) out of the collector's reach,
since a full collection walks millions of torch objects with the GIL held, a stall of every
stream. The figures are in docs/operations.md ("Memory"). A no-op where the C library is not
glibc. Imports gc, os, ctypes and runtime.logging.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from collections.abc import Callable

from runtime.logging import get_logger

# A step allocates tensors of many sizes (logits, activations of prefill chunks of any length).
# glibc raises its mmap threshold after a large buffer is freed, so later ones come from the
# heap arenas, and the freed space between live chunks is kept, not returned: a 10-minute soak
# (ops/load/soak.py) grew 20% that way, and 3.1% with the trim
# (ops/results/soak-600s-c6-2026-11-23-xeon-amx.json). Pinning the threshold instead
# (MALLOC_MMAP_THRESHOLD_=128K) cost 45% of c=32 throughput (every large buffer mmapped and
# faulted in again). malloc_trim releases the free pages inside every arena (madvise), keeps the
# allocator's fast path and takes a few milliseconds; the executor calls it between steps at
# most every few seconds.
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


# oneDNN (torch's CPU matmuls) compiles and caches a kernel per new shape, 1024 by default; a
# step's token count and attention lengths vary, so the cache kept filling (~300 MiB, still
# growing after a minute of load). 64 entries cost 4% of c=32 throughput; 256 is between. The
# operator's ONEDNN_PRIMITIVE_CACHE_CAPACITY wins.
ONEDNN_CACHE_ENTRIES = "256"


def bound_native_caches() -> None:
    """Call before torch is imported: oneDNN reads its cache size once."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_CACHE_ENTRIES)


# Python's cyclic collector walks every tracked object in a full (generation 2) collection, and
# a server with torch and transformers loaded holds millions (docs/operations.md, "Memory").
# Freezing once the models are loaded and warm moves everything alive then into the permanent
# generation, which collections skip (vLLM does the same at the end of its warm-up; SGLang
# offers it as a call); what requests allocate later is collected as before.
def freeze_startup_heap(reason: str = "startup") -> int:
    """Collect once, then keep every object alive now out of later collections; how many
    (logged as `heap_frozen`)."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    get_logger("memory").info("heap_frozen", objects=frozen, reason=reason)
    return frozen


# Graphs compiled in the background after the startup freeze (inductor's and dynamo's objects,
# hundreds of thousands) made a full collection slow again; one stalled a 64-row step in step
# with every stream after a burst (ops/results/performance-history-2026-11-22-to-27.md;
# ops/results/overhead-c64-unique-refreeze-after-compile-2026-11-27-xeon-amx.json). So the
# compile thread calls this when its last graph is in. A test's in-process server never froze,
# and does not then.
def refreeze_heap(reason: str) -> int | None:
    """Freeze again what was built since the startup freeze, where the startup froze; else None."""
    return freeze_startup_heap(reason) if gc.get_freeze_count() else None
