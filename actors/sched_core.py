"""The scheduler's pure core: continuous batching over a paged KV cache. No torch, no trio.

Owns: the waiting and running queues, each request's `Sequence` (actors/sequence.py: its
progress, block table, and the counts it reports, such as the prompt tokens the prefix cache
served), and the decisions of every step. Two calls drive it (vLLM v1's shape, nano-vllm's size):

    plan = core.schedule()          # what the next packed forward computes
    outputs = core.update(plan, result)   # what it produced; finished requests leave

Every request is "tokens whose KV is computed" plus "tokens still to feed". A prompt is fed in
chunks that fit the per-step token budget, so a long prompt never stalls running decodes: each
step first gives every running request its share (one token for a decoding request, a chunk for
one still prefilling), then admits waiting requests first-come-first-served with what is left,
nothing behind the head of the queue before it (but one waiting for a LoRA adapter's slot:
actors/adapter_gate.py), so no request starves. When blocks run out, the most recently admitted
running request is preempted by recompute (`_preempt`). While requests stream, prompt chunks
also fit a time budget measured on this machine's steps (actors/step_cost.py), so a stream's gap
between chunks stays within `step_stretch` x a decode step, except in a burst (`is_burst`: one
step starts every waiting prompt). Images are encoded ahead of their tokens (actors/encode_ahead.py).
"""

from __future__ import annotations

from collections import deque

from actors.adapter_gate import AdapterGate
from actors.blocks import BlockManager
from actors.drafting import Drafter, attach_drafts
from actors.encode_ahead import EncodeAhead
from actors.lookahead import plan_ahead
from actors.model_drafts import ModelDrafter, observe_step
from actors.plans import PlanBuilder
from actors.sequence import SchedulerConfig, SeqStatus, Sequence
from actors.step_cost import PromptTokens, StepCostModel, is_burst
from runtime.messages import FinishReason, ForkedSeq, Logprob, StepPlan, StepResult, TokenDelta, TokenizedRequest

__all__ = ["SchedulerConfig", "SchedulerCore", "SeqStatus", "Sequence"]


class SchedulerCore:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.blocks = BlockManager(config.num_blocks, config.block_size)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.requests: dict[str, Sequence] = {}
        # Siblings (n > 1) held back while the first sequence computes the prompt. The step that finishes it
        # also samples their first tokens from its last row (each with its own seed), and they take its prompt
        # blocks: full ones shared, the partly filled last one copied (`plans.reserved_copies`, run by the next
        # step before its forward). The prompt is prefilled once for all n. A sibling that misses that step
        # re-joins the queue, where the prefix cache still serves it every full block.
        self.forks: dict[str, list[Sequence]] = {}
        self.plans = PlanBuilder(config.block_size)
        self.drafter = (ModelDrafter if config.draft_model else Drafter)(config.num_spec_tokens, config.spec_max_rows) if config.num_spec_tokens > 0 else None
        self._step_times = (0.0, 0.0)  # (started, finished) of the step update() is applying
        self.num_prefill_tokens = 0  # prompt tokens computed (not served from cache), lifetime
        self.num_preemptions = 0
        self.step_cost = StepCostModel(config.step_samples)
        self.encoding = EncodeAhead()  # images to encode before their tokens are fed

    # -- requests in and out ------------------------------------------------------------------

    def add(self, request: TokenizedRequest) -> None:
        seq = Sequence.of(request)
        self.requests[seq.request_id] = seq
        self.encoding.add(seq.request_id, request.mm)
        parent = self.requests.get(request.fork_of) if request.fork_of else None
        if parent is not None and parent.num_computed_tokens < parent.num_prompt_tokens:
            self.forks.setdefault(parent.request_id, []).append(seq)
        else:
            self.waiting.append(seq)

    def abort(self, request_id: str) -> bool:
        """Forget a request wherever it is; its blocks are free at once. False if unknown."""
        seq = self.requests.get(request_id)
        if seq is None:
            return False
        if seq.status is SeqStatus.WAITING:
            if seq in self.waiting:
                self.waiting.remove(seq)
            else:
                for held in self.forks.values():
                    if seq in held:
                        held.remove(seq)
        elif seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        self._finish(seq)
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step -----------------------------------------------------------------------------

    def schedule(self) -> StepPlan | None:
        chunk_limit = budget = self.config.max_num_batched_tokens
        streams = sum(1 for seq in self.running if seq.num_output_tokens > 0)  # requests waiting between chunks
        if self.config.burst_tokens and is_burst(min(len(self.waiting), self.config.max_num_seqs - len(self.running)), streams):
            streams, budget = 0, max(budget, self.config.burst_tokens)  # started as if nobody streamed
        streaming = streams > 0
        allowance, encode_budget_s = self._step_allowances(streaming, budget)
        # While requests stream, as many prompt chunks as the runner's fastest step carries (SchedulerConfig.max_prompt_chunks).
        prompt = PromptTokens(allowance, self.config.max_prompt_chunks if streaming else None)
        scheduled: list[tuple[Sequence, int]] = []
        preemptions_before = self.num_preemptions
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SeqStatus.RUNNING:  # preempted to make room for an earlier one
                continue
            num_new = prompt.take(self.encoding.limit(seq, min(seq.num_tokens - seq.num_computed_tokens, budget, chunk_limit)))
            if num_new == 0:
                continue  # a prompt chunk with no time left in this step, or an image not encoded yet; its blocks stay
            if not self._reserve_or_preempt(seq, num_new):
                break  # `seq` itself had to go: nothing behind it can run either
            scheduled.append((seq, num_new))
            budget -= num_new
        preempted = self.num_preemptions != preemptions_before

        # Admission only when nobody was preempted: a preempted request waits at the head of
        # the queue, and admitting others now would only thrash. One waiting for an adapter's slot is passed.
        gate, passed = AdapterGate(self.running, self.config.max_adapters), []
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            if not gate.admits(seq := self.waiting[0]):
                passed.append(self.waiting.popleft())
                continue
            if not seq.block_table:
                self._attach_cached_prefix(seq)
            num_new = prompt.take(self.encoding.limit(seq, min(seq.num_tokens - seq.num_computed_tokens, budget, chunk_limit)))
            if num_new == 0 and not self.encoding.waits(seq):  # else admitted with no tokens: its image is encoded first
                break
            need = self.blocks.blocks_needed(seq.num_computed_tokens + num_new) - len(seq.block_table)
            if not self.blocks.can_allocate(need):
                self._release(seq)
                break
            seq.block_table += self.blocks.allocate(need)
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            seq.admitted = True
            self.running.append(seq)
            gate.started(seq)
            scheduled += [(seq, num_new)] if num_new else []
            budget -= num_new
        self.waiting.extendleft(reversed(passed))

        encode = self.encoding.wanted(self.running)
        if not scheduled and not encode:
            return None
        plan = self._make_plan(scheduled, attach_drafts(self, self.drafter, scheduled) if self.drafter is not None else {}, [seq for seq, _ in encode])
        return self.encoding.attach(plan, encode, encode_budget_s)

    def schedule_ahead(self, in_flight: StepPlan) -> StepPlan | None:
        """The next step, planned while `in_flight` runs, when it can be (actors/lookahead.py),
        and not while a request would draft: a draft starts from the token in flight."""
        if self.drafter is not None and self.drafter.wants(self.step_cost, [self.requests[s.request_id] for s in in_flight.seqs if s.request_id in self.requests]):
            return None
        return plan_ahead(self, in_flight)

    def update(self, plan: StepPlan, result: StepResult, started: float = 0.0, finished: float = 0.0) -> list[TokenDelta]:
        """Apply a step's result. Tokens for requests aborted meanwhile are dropped.

        `started` / `finished`: when the step was sent and when its result came back (the
        shell's clock; the core keeps none). A request's first delta carries its
        `RegisterRequest`, every token its queue wait.
        """
        outputs: list[TokenDelta] = []
        self._step_times = (started, finished)
        if result.error is None:  # the fit learns the forward alone: a draft model's own forwards and the encoder's seconds apart
            observe_step(self.step_cost, self.drafter, plan, result, finished - started - result.encoder_s)
        for request_id, error in self.encoding.update(plan, result):
            self._fail(self.requests.get(request_id), error, outputs)
        batch_size = len(plan.seqs) + sum(len(item.forks or ()) for item in plan.seqs)
        for item in plan.seqs:
            seq = self.requests.get(item.request_id)
            stale = item.sample and seq is not None and seq.num_tokens != item.start_pos + len(item.token_ids) - item.num_draft_tokens
            if seq is None or seq.status is not SeqStatus.RUNNING or item.start_pos != seq.num_computed_tokens or stale:
                # Left during the step, or not where its plan put it (planned ahead of a step that finished, preempted or forced tokens into it).
                if item.forks:  # the parent left during the step: its siblings go on alone
                    self._release_forks(item.request_id)
                continue
            if seq.scheduled_time is None:
                seq.scheduled_time = started
            if result.error is not None:
                for fork in item.forks or ():
                    self._fail(self.requests.get(fork.request_id), result.error, outputs)
                self._fail(seq, result.error, outputs)
                continue
            fed = len(item.token_ids) - item.num_draft_tokens  # a draft's tokens count once kept
            if fed > 1 or item.start_pos < seq.num_prompt_tokens:
                self.num_prefill_tokens += fed
            kept = result.drafted.get(seq.request_id, item.token_ids[fed:])[: result.accepted.get(seq.request_id, 0)]  # a draft model's tokens, or the planned ones
            seq.num_computed_tokens += fed + len(kept)
            self.blocks.commit_full_blocks(seq, seq.num_computed_tokens)
            logprobs = result.logprobs.get(seq.request_id)
            sampled_logprobs = None
            # The new tokens' entries come last (a kept draft's, then the sampled one's), when it
            # sampled (a failed row has none).
            if logprobs and item.sample and seq.sampling.logprobs is not None and seq.request_id in result.sampled:
                num_out = 1 + len(kept)
                sampled_logprobs, logprobs = logprobs[-num_out:], logprobs[:-num_out]
            logprobs = seq.score_forced(item, logprobs)  # before those, a thinking budget's forced tokens' (Sequence.held)
            if logprobs:
                seq.collect_prompt_logprobs(item.start_pos, logprobs)
            if seq.num_computed_tokens >= seq.num_prompt_tokens and seq.request_id in self.forks:
                self._adopt_forks(seq, item.forks or (), result, batch_size, outputs)
            if not item.sample:
                continue
            if seq.request_id in result.failed:
                self._fail(seq, result.failed[seq.request_id], outputs)
                continue
            if self.drafter is not None and item.num_draft_tokens:
                self.drafter.record(seq.request_id, item.num_draft_tokens, len(kept))
            self._append_token(seq, [*kept, result.sampled[seq.request_id]], batch_size, sampled_logprobs, outputs, (item.num_draft_tokens, len(kept)))
        return outputs

    def _append_token(
        self, seq: Sequence, tokens: list[int], batch_size: int, logprobs: list[Logprob] | None, outputs: list[TokenDelta], spec: tuple[int, int] = (0, 0)
    ) -> None:
        """The step's new tokens for `seq` (forced ones it held for their logprobs, a kept draft's, the sampled one), up to the first that finishes it."""
        (taken, logprobs, finish), stop_token = seq.release_held(logprobs), None
        for token in tokens if finish is None else ():  # a finish inside the held tokens drops the token sampled after them
            seq.token_ids.append(token)
            taken.append(token)
            finish, stop_token = seq.finish_reason(token, self.config.eos_token_ids, self.config.max_model_len)
            if finish is None and seq.thinking is not None:
                finish = seq.think(token, taken, self.config.max_model_len)
            if finish is not None:
                break
        if finish is not None:
            self.running.remove(seq)
            self._finish(seq)
        started, finished = self._step_times
        outputs.append(
            TokenDelta(
                request_id=seq.request_id,
                token_ids=taken,
                num_draft_tokens=spec[0],
                num_accepted_tokens=spec[1],
                finish_reason=finish,
                stop_token_id=stop_token,
                batch_size=batch_size,
                queue_wait_us=seq.queue_wait_us(started, finished),
                logprobs=logprobs[: len(taken)] if logprobs is not None else None,
                prompt_logprobs=seq.take_prompt_logprobs(),
                register=seq.take_register(started),
            )
        )

    def _fail(self, seq: Sequence | None, error: str, outputs: list[TokenDelta]) -> None:
        """End one request with an error; the others in its step carry on."""
        if seq is None or seq.status is SeqStatus.FINISHED:
            return
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        else:
            for held in self.forks.values():
                if seq in held:
                    held.remove(seq)
        self._finish(seq)
        register = seq.take_register(self._step_times[0])  # its mailbox, if the detokenizer has not got it yet
        outputs.append(TokenDelta(request_id=seq.request_id, token_ids=[], finish_reason=FinishReason.ABORT, error=error, register=register))

    def _adopt_forks(
        self, parent: Sequence, forks: tuple[ForkedSeq, ...], result: StepResult, batch_size: int, outputs: list[TokenDelta]
    ) -> None:
        """The parent's prompt is computed: siblings sampled in this step take its prompt blocks."""
        held = self.forks.pop(parent.request_id, [])
        forked = {fork.request_id for fork in forks}
        bs = self.config.block_size
        num_full = parent.num_prompt_tokens // bs
        for child in held:
            if child.request_id not in forked or child.request_id not in result.sampled:
                if child.request_id in result.failed:
                    self._fail(child, result.failed[child.request_id], outputs)
                    continue
                self._release(child)  # missed the step (added after it was planned): queue it
                self.waiting.appendleft(child)
                continue
            shared = parent.block_table[:num_full]
            self.blocks.share(shared)
            child.block_table = shared + child.block_table  # + its reserved copy of the last block
            child.num_computed_tokens = parent.num_prompt_tokens
            child.num_hashed_blocks = parent.num_hashed_blocks
            child.last_block_hash = parent.last_block_hash
            child.last_block_ref = parent.last_block_ref
            child.prompt_logprobs = parent.prompt_logprobs
            child.status = SeqStatus.RUNNING
            child.admitted = True
            self.running.append(child)
            entries = result.logprobs.get(child.request_id)
            logprobs = entries[-1:] if entries and child.sampling.logprobs is not None else None
            self._append_token(child, [result.sampled[child.request_id]], batch_size, logprobs, outputs)

    # -- internals ----------------------------------------------------------------------------

    def _step_allowances(self, streaming: bool, budget: int) -> tuple[int, float | None]:
        """The step's prompt tokens (of `budget`) and the seconds of encoder work it grants (step_cost.py `allowances`)."""
        held = min(len(self.running) + len(self.waiting), self.config.max_num_seqs)
        encoding = self.encoding.any_waits(self.running) or self.encoding.any_waits(self.waiting)  # those admission may take too
        return self.step_cost.allowances(held if streaming else 0, self.config.step_stretch, budget, self.config.block_size, encoding)

    def _release_forks(self, parent_id: str) -> None:
        for child in reversed(self.forks.pop(parent_id, [])):
            self._release(child)  # a block reserved for a fork that did not happen
            self.waiting.appendleft(child)

    def _reserve_or_preempt(self, seq: Sequence, num_new: int) -> bool:
        """Make room for `num_new` more tokens of a running `seq`, preempting from the tail."""
        need = self.blocks.blocks_needed(seq.num_computed_tokens + num_new) - len(seq.block_table)
        while not self.blocks.can_allocate(need):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        seq.block_table += self.blocks.allocate(need)
        return True

    def _preempt(self, seq: Sequence) -> None:
        """By recompute: its blocks freed, back to the front of the queue (the prefix cache usually gives most straight back)."""
        self.running.remove(seq)
        self._release(seq)
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _attach_cached_prefix(self, seq: Sequence) -> None:
        if seq.sampling.prompt_logprobs is not None and len(seq.prompt_logprobs) < seq.num_prompt_tokens - 1:
            return  # prompt logprobs need every prompt position computed, not served from cache
        hits, last_hash = self.blocks.match_prefix(seq.all_token_ids, seq.cache_limit(), seq.prefix_root)
        seq.block_table = hits
        seq.num_computed_tokens = len(hits) * self.config.block_size
        seq.num_hashed_blocks = len(hits)
        seq.last_block_hash = last_hash
        seq.last_block_ref = self.blocks.block_ref(hits[-1]) if hits else None
        if not seq.admitted:
            seq.num_cached_tokens = seq.num_computed_tokens

    def _release(self, seq: Sequence) -> None:
        self.blocks.free_blocks(seq.block_table)
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_hashed_blocks = 0
        seq.last_block_hash = None
        seq.last_block_ref = None

    def _finish(self, seq: Sequence) -> None:
        if seq.request_id in self.forks:  # its siblings go on without it
            self._release_forks(seq.request_id)
        self._release(seq)
        seq.status = SeqStatus.FINISHED
        del self.requests[seq.request_id]
        self.encoding.forget(seq.request_id)
        if self.drafter is not None:
            self.drafter.forget(seq)
        self.plans.freed.append(seq.request_id)

    def _make_plan(self, scheduled: list[tuple[Sequence, int]], drafts: dict[str, list[int]], encode: list[Sequence]) -> StepPlan:
        seqs, introduced = [], list(encode)  # the runner needs a request's images to encode them
        for seq, num_new in scheduled:
            sample = seq.num_computed_tokens + num_new == seq.num_tokens
            forks = self._plan_forks(seq) if sample and seq.num_output_tokens == 0 else None
            seqs.append(self.plans.seq(seq, num_new, forks, drafts.get(seq.request_id)))
            introduced += [seq, *(self.requests[f.request_id] for f in forks or ())]
        return self.plans.plan(seqs, introduced)

    def _plan_forks(self, parent: Sequence) -> tuple[ForkedSeq, ...] | None:
        """Siblings to sample in the step that finishes `parent`'s prompt, each with its copy
        of the partly filled last prompt block reserved now (so a drawn token always lands)."""
        held = self.forks.get(parent.request_id)
        if not held:
            return None
        bs = self.config.block_size
        partial = parent.num_prompt_tokens % bs != 0
        forks = []
        for child in held:
            if partial and not child.block_table:
                if not self.blocks.can_allocate(1):
                    break  # the rest re-join the queue after this step and use the prefix cache
                child.block_table = self.blocks.allocate(1)
                self.plans.reserved_copies.append((parent.block_table[parent.num_prompt_tokens // bs], child.block_table[0]))
            forks.append(ForkedSeq(request_id=child.request_id, seed=child.seed))
        return tuple(forks) or None

    def statistics(self) -> dict[str, int]:
        return {
            "waiting": len(self.waiting) + sum(len(v) for v in self.forks.values()),
            "running": len(self.running),
            "requests": len(self.requests),
            "kv_blocks_used": self.blocks.num_used_blocks,
            "kv_blocks_free": self.blocks.num_free_blocks,
            "prefix_queries": self.blocks.num_prefix_queries,
            "prefix_hits": self.blocks.num_prefix_hits,
            "prefill_tokens": self.num_prefill_tokens,
            "preemptions": self.num_preemptions,
            "spec_draft_tokens": self.drafter.num_drafted if self.drafter is not None else 0,
            "spec_accepted_tokens": self.drafter.num_accepted if self.drafter is not None else 0,
        }
