"""`EncoderCache`: vision encoder outputs by image hash, least recently used out first.

A repeated image (the same content, processed the same way) is encoded once while its output
stays here: a chunked prompt that feeds an image's tokens over several steps, a request
preempted and recomputed, and another request with the same image all read it. Bounded by
rows (one per placeholder token); an entry larger than the whole cache is used and not kept.
Device thread only.
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class EncoderCache:
    def __init__(self, capacity_rows: int = 16384) -> None:
        self.capacity_rows = capacity_rows
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._rows = 0
        self.hits = 0
        self.misses = 0  # images encoded

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def get(self, key: str, count: bool = True) -> torch.Tensor | None:
        """The entry, now the most recently used. `count`: a hit when found (an image not
        encoded again); an image fed after it was encoded ahead is read without counting."""
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            self.hits += count
        return found

    def put(self, key: str, features: torch.Tensor) -> None:
        self.misses += 1
        if features.shape[0] > self.capacity_rows:
            return
        while self._rows + features.shape[0] > self.capacity_rows and self._entries:
            _, old = self._entries.popitem(last=False)
            self._rows -= old.shape[0]
        self._entries[key] = features
        self._rows += features.shape[0]

    def statistics(self) -> dict[str, int]:
        return {"encoder_cache_hits": self.hits, "images_encoded": self.misses, "encoder_cache_entries": len(self._entries), "encoder_cache_rows": self._rows}
