"""The scheduler's side of encoding images ahead of their tokens. Pure: no torch, no trio.

Owns: `EncodeAhead`, each request's images whose vision encoder output the runner has not
reported yet (by content hash, with the prompt positions of their placeholder tokens). With it
the core holds a prompt chunk back before the first placeholder token of an image not encoded
yet (`limit`), and names the images the next step should encode (`wanted`:
StepPlan.encode_ahead); StepResult.images_encoded ends the wait (`encoded`).

Why: run whole inside the step that first feeds an image's tokens, the encoder was that step's
length (50-70 ms against a ~20 ms decode on the 2-core CPU), and every stream in the step
waited it out. Ahead of the tokens, the runner can spread it over steps in slices that fit the
step's time budget (actors/runners/vision/slices.py), like a prompt's chunks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from actors.sequence import Sequence
from runtime.messages import MultiModalPrompt, StepPlan, StepResult


@dataclass(slots=True, frozen=True)
class _Image:
    hash: str
    start: int  # the prompt position of its first placeholder token
    end: int  # one past its last


class EncodeAhead:
    def __init__(self) -> None:
        self._pending: dict[str, list[_Image]] = {}  # request id -> its images not reported encoded, in prompt order

    def add(self, request_id: str, mm: MultiModalPrompt | None) -> None:
        if mm is not None and mm.images:
            self._pending[request_id] = [_Image(i.hash, i.runs[0][0], i.runs[-1][0] + i.runs[-1][1]) for i in mm.images]

    def forget(self, request_id: str) -> None:
        self._pending.pop(request_id, None)

    def limit(self, seq: Sequence, num_new: int) -> int:
        """How many of `seq`'s next `num_new` tokens may be fed: up to the first placeholder of
        the first image not encoded yet that is still to be fed (none once it is inside it:
        a preempted request recomputing an image the runner has since let go of)."""
        for image in self._pending.get(seq.request_id, ()):
            if image.end > seq.num_computed_tokens:
                return min(num_new, max(0, image.start - seq.num_computed_tokens))
        return num_new

    def waits(self, seq: Sequence) -> bool:
        """Whether `seq` has an image still to be fed that is not encoded yet."""
        return any(image.end > seq.num_computed_tokens for image in self._pending.get(seq.request_id, ()))

    def any_waits(self, seqs: Iterable[Sequence]) -> bool:
        return bool(self._pending) and any(self.waits(seq) for seq in seqs)

    def wanted(self, seqs: Iterable[Sequence]) -> list[tuple[Sequence, str]]:
        """The images of `seqs` (in the order given, each request's in prompt order) the runner
        should encode now: each with its request."""
        return [(seq, image.hash) for seq in seqs for image in self._pending.get(seq.request_id, ()) if image.end > seq.num_computed_tokens]

    @staticmethod
    def attach(plan: StepPlan, wanted: list[tuple[Sequence, str]], budget_s: float | None) -> StepPlan:
        """`plan` asking the runner to encode `wanted` first, for at most `budget_s` seconds."""
        if not wanted:
            return plan
        return msgspec.structs.replace(plan, encode_ahead=tuple((seq.request_id, image) for seq, image in wanted), encode_budget_s=budget_s)

    def update(self, plan: StepPlan, result: StepResult) -> list[tuple[str, str]]:
        """Learn what the runner encoded; the requests whose encoder failed, with the error."""
        self.encoded(result.images_encoded)
        return [(request_id, result.failed[request_id]) for request_id in dict.fromkeys(r for r, _ in plan.encode_ahead) if request_id in result.failed]

    def encoded(self, hashes: tuple[str, ...]) -> None:
        """The runner holds these images' encoder output: their tokens may be fed."""
        if not hashes:
            return
        done = set(hashes)
        for request_id in list(self._pending):
            left = [image for image in self._pending[request_id] if image.hash not in done]
            if left:
                self._pending[request_id] = left
            else:
                del self._pending[request_id]
