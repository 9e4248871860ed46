"""How big the paged KV cache is when neither --kv-cache-gib nor --num-kv-blocks is given.

Owns the rule (`auto_kv_bytes`): a share of the memory the device has (`--memory-utilization`,
vLLM's `--gpu-memory-utilization`: 0.9 of a GPU, 0.5 of the host's memory on a CPU), less what
the process holds once the weights are in and a reserve for a step's work, and never more than
`max_num_seqs` sequences of the full context can use: so a model gets its whole context window
wherever memory allows, instead of a fixed 1 GiB. Also what bounds the host's memory
(`host_memory`: RAM, or the cgroup's limit when lower). On a CPU the cache is zeroed lazily
by the OS (actors/runners/kv_alloc.py), so the part no request has reached costs nothing
resident. Imports the standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30
DEFAULT_UTILIZATION = {"cuda": 0.9, "cpu": 0.5}
FLOOR_BYTES = GIB  # the fixed size before: never less where memory allows
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


@dataclass(frozen=True)
class Memory:
    total: int  # what the process may use on the device, in bytes
    in_use: int  # what it (or, on a GPU, anything) holds now
    available: int  # what is free for it now


def utilization(device_type: str, given: float | None) -> float:
    return given if given is not None else DEFAULT_UTILIZATION.get(device_type, DEFAULT_UTILIZATION["cpu"])


def auto_kv_bytes(memory: Memory, fraction: float, reserve: int, per_token: int, max_len: int, max_seqs: int) -> int:
    """The KV cache's bytes: fraction x total, less what is in use and the reserve, within what
    is free; at most max_seqs full-length sequences' worth; at least FLOOR_BYTES (or all of the
    free memory, if less)."""
    budget = min(int(fraction * memory.total) - memory.in_use - reserve, memory.available - reserve)
    useful = per_token * max_len * max_seqs
    floor = min(FLOOR_BYTES, max(memory.available - reserve, 0), useful)
    return max(min(budget, useful), floor)


def host_memory(meminfo: str = "/proc/meminfo", cgroup_files: tuple[str, ...] = _CGROUP_LIMITS, statm: str = "/proc/self/statm") -> Memory:
    """The host's memory as this process may use it: RAM or the cgroup's limit, the process's
    resident set, and what the kernel counts available (the cgroup's headroom when lower)."""
    info = {}
    for line in Path(meminfo).read_text().splitlines():
        key, _, value = line.partition(":")
        info[key] = int(value.split()[0]) * 1024
    total, available = info["MemTotal"], info.get("MemAvailable", info.get("MemFree", 0))
    resident = int(Path(statm).read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    for name in cgroup_files:
        try:
            limit = Path(name).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and int(limit) < total:
            total = int(limit)
            available = min(available, total - resident)
        break
    return Memory(total=total, in_use=resident, available=available)
