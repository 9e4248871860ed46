"""runtime.memory: the heap trim works here (glibc) and the oneDNN cap never overrides an operator."""

from __future__ import annotations

import os

import pytest

from runtime import memory


def test_trim_heap_releases_freed_pages() -> None:
    # Many small live-then-freed buffers leave free pages in the arena; glibc returns them.
    if memory._trim is None:
        pytest.skip("not glibc")
    chunks = [bytearray(64 * 1024) for _ in range(2000)]  # under the mmap threshold: heap
    del chunks  # 125 MiB of free heap pages
    assert memory.trim_heap() is True


def test_bound_native_caches_sets_a_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    memory.bound_native_caches()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == memory.ONEDNN_CACHE_ENTRIES


def test_bound_native_caches_keeps_the_operators_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024")
    memory.bound_native_caches()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "1024"


def test_the_heap_is_frozen_again_only_where_the_startup_froze_it() -> None:
    # In a process of its own: a frozen heap outlives the call (a test process must not freeze).
    import subprocess
    import sys

    script = """
import gc
from runtime import memory
assert memory.refreeze_heap("graphs_compiled") is None and gc.get_freeze_count() == 0
first = memory.freeze_startup_heap()
built_later = [[i] for i in range(50_000)]  # what a background compile leaves alive
again = memory.refreeze_heap("graphs_compiled")
assert again is not None and again >= first + 50_000, (first, again)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "reason=graphs_compiled" in proc.stdout  # the log line says why
