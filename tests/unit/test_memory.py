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
