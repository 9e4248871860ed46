"""What a runner keeps of each request between steps: `RequestStates`. No torch.

Owns: per-request device-side state, keyed by request id, with the device thread as its only
writer: the token history (the prompt, then every token sampled for the request: penalties,
prompt logprobs and the token an overlapped step feeds read it) and the grammar matcher, which
each sampled token advances. A request's state is made from the `NewRequest` of the first plan
that schedules it and dropped when a plan lists it in `freed_request_ids`.

A request that thinks (`sampling.thinking`) with a grammar has the grammar start where its
thinking ends: the matcher is live only from there (`live_matcher`), so thinking is free text.

The scheduler decides positions; the state follows them. Before a request samples the token at
position p, its history is cut back to p tokens (`align`), and its matcher rolled back by as
many: a token the core never applied (its request was preempted, or re-queued when its parent
left, while the step that sampled it ran) is forgotten here too, so both sides agree on every
position without the core reaching into the runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.messages import PENDING_TOKEN, ScheduledSeq, StepPlan
from runtime.reasoning import ThinkingTracker
from runtime.sampling import Thinking


@dataclass(slots=True)
class RequestState:
    history: list[int]  # prompt, then every token sampled for the request
    num_prompt_tokens: int
    matcher: Any = None  # llguidance matcher (the guide's grammar), or None
    mm: Any = None  # the prompt's images (runtime.messages.MultiModalPrompt) and what the model path derives from them
    # A request that thinks: its grammar starts where thinking ends (`grammar_from`, a history
    # position; None while it thinks), followed by `thinking` over the history up to `tracked`.
    thinking: Any = None  # runtime.reasoning.ThinkingTracker
    grammar_from: int | None = None
    tracked: int = 0
    # The history as int64 (penalties read all of it every step): its first `synced` entries are
    # the history's; tokens are only appended to the history, or cut by `rewind`.
    array: np.ndarray | None = None
    synced: int = 0

    def history_array(self) -> np.ndarray:
        """The history as an int64 array, its new tokens copied in (a view: read it this step)."""
        size = len(self.history)
        if self.array is None or len(self.array) < size:
            grown = np.empty(max(64, 2 * size), dtype=np.int64)
            if self.array is not None:
                grown[: self.synced] = self.array[: self.synced]
            self.array = grown
        if self.synced < size:
            self.array[self.synced : size] = self.history[self.synced : size]
            self.synced = size
        return self.array[:size]

    def live_matcher(self, spec: Thinking | None) -> Any:
        """The matcher when it constrains the next token: always for a request that does not
        think; for one that does, from the end of its thinking on (the thinking is free text)."""
        if self.matcher is None or spec is None:
            return self.matcher
        if self.grammar_from is None:
            self._follow(spec)
        return self.matcher if self.grammar_from is not None else None

    def _follow(self, spec: Thinking) -> None:
        if self.thinking is None:
            self.thinking, self.tracked = ThinkingTracker(spec), self.num_prompt_tokens
        tracker = self.thinking
        while self.tracked < len(self.history) and not tracker.done:
            tracker.push(self.history[self.tracked])
            self.tracked += 1
        if not tracker.done:
            return
        if tracker.count == 0:  # it never thought: what it wrote goes to the grammar after all
            self.grammar_from = self.num_prompt_tokens
            for token in self.history[self.num_prompt_tokens :]:
                self.matcher.consume_token(token)
        else:
            self.grammar_from = self.tracked

    def rewind(self, position: int) -> None:
        """Forget everything from `position` on: the history, and what the matcher and the
        thinking tracker read of it."""
        extra = len(self.history) - position
        if extra <= 0:
            return
        if self.matcher is not None and (self.thinking is None or self.grammar_from is not None):
            start = self.grammar_from if self.grammar_from is not None else 0
            self.matcher.rollback(len(self.history) - max(position, start))
            if self.grammar_from is not None and position < self.grammar_from:
                self.grammar_from = None
        if self.thinking is not None and self.tracked > position:
            self.thinking, self.tracked = None, 0  # followed again from the prompt's end
        del self.history[position:]
        self.synced = min(self.synced, position)


class UnknownRequest(KeyError):
    """A plan names a request no plan introduced (a scheduler bug): that request fails."""


class RequestStates:
    def __init__(self) -> None:
        self._by_id: dict[str, RequestState] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    def apply(self, plan: StepPlan) -> None:
        """Drop the freed requests, then take in the new ones (an id may be both: a request the
        core finished and re-admitted under the same id is a new request)."""
        for request_id in plan.freed_request_ids:
            self._by_id.pop(request_id, None)
        for new in plan.new_requests:
            self._by_id[new.request_id] = RequestState(list(new.prompt_token_ids), len(new.prompt_token_ids), new.matcher, new.mm)

    def get(self, request_id: str) -> RequestState:
        try:
            return self._by_id[request_id]
        except KeyError:
            raise UnknownRequest(request_id) from None

    def input_ids(self, seq: ScheduledSeq) -> list[int]:
        """The tokens to feed for `seq`, with each pending token taken from the history. A fed
        token past the history that the runner did not sample (one the core added itself) joins
        the history; a draft's tokens do not, until they are kept."""
        state = self.get(seq.request_id)
        history = state.history
        fed = list(seq.token_ids)
        if PENDING_TOKEN in fed:
            fed = [history[seq.start_pos + i] if t == PENDING_TOKEN else t for i, t in enumerate(fed)]
        confirmed_end = seq.start_pos + len(fed) - seq.num_draft_tokens
        # A token the core wrote in place of one sampled here (a forced end of thinking after
        # the last token it kept): the history follows the core from there.
        for pos in range(max(seq.start_pos, state.num_prompt_tokens), min(confirmed_end, len(history))):
            if history[pos] != fed[pos - seq.start_pos]:
                state.rewind(pos)
                break
        if confirmed_end > len(history) >= seq.start_pos:
            history.extend(fed[len(history) - seq.start_pos : confirmed_end - seq.start_pos])
        return fed

    def align(self, request_id: str, position: int) -> RequestState:
        """The state as of `position` tokens: anything sampled past it is forgotten."""
        state = self.get(request_id)
        state.rewind(position)
        return state

