"""glibc's malloc kept from handing a step's large tensors back to the OS: `keep_freed_memory`.

A CPU step allocates and frees tensors of megabytes each (a [64, 49152] float32 logits row
block is 12.6 MB; softmax, cumsum and log-softmax each make one more). glibc serves blocks over
its mmap threshold with fresh mmaps and trims freed memory off the heap's top, so every such
tensor costs its page faults again, step after step: on one Zen 4 thread, temperature-1
sampling of 64 rows took 390 us a row of host work with them and 131 without
(`python -m ops.bench.runner_host`, docs/performance.md "The runner's host work"). Raising the
mmap threshold to glibc's largest (32 MiB) and the trim threshold to 1 GiB keeps freed blocks
for the next step; what stays resident is at most the largest step's working set. A KV cache
(hundreds of MB, kv_alloc.lazy_zeros) is still a fresh mapping, zeroed on first touch.
Not glibc (musl, macOS): nothing to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util

from runtime.logging import get_logger

log = get_logger("runner")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 1 << 30
_done = False


def keep_freed_memory() -> bool:
    """Once per process: whether glibc took the settings."""
    global _done
    if _done:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    log.debug("malloc_thresholds", applied=_done, mmap_threshold=MMAP_THRESHOLD, trim_threshold=TRIM_THRESHOLD)
    return _done
