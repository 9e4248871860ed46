"""Which waiting requests may start beside the running ones when at most `--max-loras` LoRA
adapters run at once (the runner's slots: actors/runners/native/lora.py). Pure: no torch, no trio.

Owns `AdapterGate`, built once a step over the running requests. A request for an adapter
without a slot while every slot is taken waits, and the requests behind it pass it (the base's,
and those of the adapters running), except one running adapter chosen to drain: the one with
the fewest running requests, which starts no new request while anyone waits for a slot. It
finishes in bounded time, the waiting request takes its place, and the step stays full
meanwhile: 4 slots for 8 adapters at c=32 read 0.69 of the base's tokens/s, where waiting at
the head with everyone behind it read 0.45 (a slot each: 0.86; ops/results/lora-8-adapters-*).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from actors.sequence import Sequence


class AdapterGate:
    def __init__(self, running: Iterable[Sequence], limit: int) -> None:
        """`limit`: adapters at once (0: no limit, no adapters served)."""
        self.limit = limit
        self.counts: Counter[str] = Counter(a for seq in running if (a := seq.sampling.adapter) is not None) if limit else Counter()
        self.slot_wanted = False  # a request passed over this step waits for a slot

    def admits(self, seq: Sequence) -> bool:
        """Whether `seq` starts now (then `started`); False: it waits at the head, others pass."""
        adapter = seq.sampling.adapter
        if not self.limit or adapter is None:
            return True
        if adapter in self.counts:
            return not (self.slot_wanted and adapter == self.draining())
        if len(self.counts) < self.limit:
            return True
        self.slot_wanted = True
        return False

    def started(self, seq: Sequence) -> None:
        if self.limit and (adapter := seq.sampling.adapter) is not None:
            self.counts[adapter] += 1

    def draining(self) -> str:
        """The running adapter that starts nothing new while a request waits for a slot."""
        return min(self.counts, key=lambda a: (self.counts[a], a))
