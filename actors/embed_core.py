"""The scheduler core for embedding models. Pure Python: no torch, no trio.

Owns: batching embedding inputs into steps. There is no KV cache and nothing to decode, so a
step is simply as many waiting inputs as fit the token budget (first come, first served; an
input larger than the budget runs alone), and every input finishes in the step that ran it.
Same interface as `SchedulerCore`, so the scheduler actor drives either.
"""

from __future__ import annotations

from collections import OrderedDict

from actors.sequence import Sequence
from runtime.messages import FinishReason, ScheduledSeq, StepPlan, StepResult, TokenDelta, TokenizedRequest


class EmbeddingSchedulerCore:
    def __init__(self, max_num_batched_tokens: int, max_num_seqs: int) -> None:
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.waiting: OrderedDict[str, TokenizedRequest] = OrderedDict()
        self.requests = self.waiting  # every known request is waiting until its step
        self._in_flight: dict[str, TokenizedRequest] = {}  # in the step being computed
        self._next_step_id = 0
        self.num_prefill_tokens = 0
        self.num_steps = 0

    def add(self, request: TokenizedRequest) -> None:
        self.waiting[request.request_id] = request

    def abort(self, request_id: str) -> bool:
        """Forget a request; one in the step in flight gets no output. False if unknown."""
        return (self.waiting.pop(request_id, None) or self._in_flight.pop(request_id, None)) is not None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting)

    def schedule(self) -> StepPlan | None:
        seqs: list[ScheduledSeq] = []
        budget = self.max_num_batched_tokens
        for request_id, request in list(self.waiting.items()):
            n = len(request.prompt_token_ids)
            if seqs and (n > budget or len(seqs) >= self.max_num_seqs):
                break
            del self.waiting[request_id]
            self._in_flight[request_id] = request
            seqs.append(
                ScheduledSeq(
                    request_id=request_id,
                    token_ids=list(request.prompt_token_ids),
                    start_pos=0,
                    block_table=[],
                    sample=False,
                    sampling=request.sampling,
                    seed=0,
                )
            )
            budget -= n
        if not seqs:
            return None
        plan = StepPlan(step_id=self._next_step_id, seqs=tuple(seqs))
        self._next_step_id += 1
        return plan

    def update(self, plan: StepPlan, result: StepResult, started: float = 0.0, finished: float = 0.0) -> list[TokenDelta]:
        """Every input of the step finishes; its one delta also registers it (SchedulerCore.update)."""
        self.num_steps += 1
        out = []
        for item in plan.seqs:
            self.num_prefill_tokens += len(item.token_ids)
            request = self._in_flight.pop(item.request_id, None)
            if request is None:  # aborted during the step
                continue
            out.append(
                TokenDelta(
                    request_id=item.request_id,
                    token_ids=[],
                    finish_reason=FinishReason.ABORT if result.error else FinishReason.STOP,
                    error=result.error,
                    batch_size=len(plan.seqs),
                    queue_wait_us=max(0, int((started - request.arrival_time) * 1e6)),
                    embedding=result.embeddings.get(item.request_id),
                    register=Sequence.of(request).take_register(started),
                )
            )
        return out

    def statistics(self) -> dict[str, int]:
        return {
            "waiting": len(self.waiting),
            "running": 0,
            "requests": len(self.waiting) + len(self._in_flight),
            "kv_blocks_used": 0,
            "kv_blocks_free": 0,
            "prefix_queries": 0,
            "prefix_hits": 0,
            "prefill_tokens": self.num_prefill_tokens,
            "preemptions": 0,
        }
