"""The paged KV cache's size and memory: how many blocks a runner gets, and zeroed tensors for them.

Owns `kv_blocks` (an explicit block count or size, else runtime/kv_budget.py's rule on this
device's memory as it is once the weights are loaded) and `lazy_zeros`: on a CPU the cache
is memory the OS hands out zeroed on first touch (calloc's fresh pages), not a buffer written
with zeros at start, so a cache sized for the whole context window costs only what requests
reach.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from runtime.kv_budget import GIB, Memory, auto_kv_bytes, host_memory, utilization

ALIGN = 64  # bytes: a cache line, what the CPU kernels' block rows start on


def device_memory(device: torch.device) -> Memory:
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return Memory(total=total, in_use=total - free, available=free)
    return host_memory()


def kv_blocks(
    device: torch.device, bytes_per_block: int, block_size: int, max_len: int, max_seqs: int, *,
    num_blocks: int | None, gib: float | None, fraction: float | None, parts: int, reserve: int,
) -> int:  # fmt: skip
    """The cache's blocks: `num_blocks` or `gib` when given, else the budget rule on one of
    `parts` equal parts of the memory share (several models in a process, replicas on a host)."""
    if num_blocks:
        return num_blocks
    if gib is not None:
        size = int(gib * GIB)
    else:
        memory = device_memory(device)
        size = auto_kv_bytes(memory, utilization(device.type, fraction) / parts, reserve, bytes_per_block // block_size, max_len, max_seqs)
    return max(16, size // bytes_per_block)


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed tensor; on a CPU backed by pages the OS zeroes when first written."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.zeros(nbytes + ALIGN, dtype=np.uint8)  # calloc: fresh pages for a large buffer
    start = -raw.ctypes.data % ALIGN
    return torch.from_numpy(raw[start : start + nbytes]).view(dtype).view(shape)
