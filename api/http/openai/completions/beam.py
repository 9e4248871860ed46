"""Beam search for /v1/completions (`use_beam_search`, MindIE completions), on top of the engine.

Owns: the beam bookkeeping (its prompts fit the context by runtime/context_window.py).
Each round asks the engine, for every live beam, for the top next-token log-probabilities (a
one-token request on prompt + beam); the prefix cache serves every full block the beams share,
so a round recomputes at most one block per beam. The algorithm is transformers'
`generate(num_beams=k)` (v5, `early_stopping=False`), step for step:

- a candidate's score is its beam's score plus the round's log-probability of the token, after
  the request's penalties; candidates are ranked over all beams at once;
- a candidate that ends its beam (EOS unless ignore_eos, a `stop_token_ids` id, or the last
  allowed token) is kept as finished only when it ranks among the top k candidates of its
  round; finished beams are scored cumulative / length ** length_penalty and the k best kept;
- the k best candidates that do not end their beam go on;
- the search stops at max_tokens, or once the best live beam, scored at its current length,
  cannot beat the worst of k finished beams.
Deterministic: no sampling.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import msgspec
import trio

from runtime.errors import ServingError
from runtime.messages import FinishReason, Logprob
from runtime.protocol import Runtime
from runtime.request import Prompt
from runtime.sampling import SamplingParams

# Penalties apply to each round's log-probabilities, the per-round scores, as transformers' beam
# search applies its logits processors after log_softmax: repetition_penalty multiplies the
# log-probability of a token already in the prompt or the beam by r (r > 1 lowers it), and
# presence / frequency subtract p * [count > 0] + f * count over the beam's own tokens. The
# logprobs a client sees are the model's raw distribution, as on the sampling path.
#
# The engine returns only the top M alternatives per beam. A round is exact because it checks,
# per beam, an upper bound on the score of any token it did not see (from the M-th log-prob and
# the penalties that could raise a token) against the k-th best candidate; a beam failing the
# check is asked again with 2M alternatives (at most the whole vocabulary). Without penalties or
# stop ids the first answer always suffices.

@dataclass(slots=True)
class Beam:
    tokens: list[int] = field(default_factory=list)
    # Per token: its raw log-probability under the model and the alternatives the engine gave.
    logprobs: list[Logprob] = field(default_factory=list)
    # The search score: the sum of the per-round (penalized) log-probabilities. Without
    # penalties, the cumulative log-probability of `tokens`.
    cumulative_logprob: float = 0.0
    finished: bool = False  # ended by EOS or a stop token id (the last token)
    stop_token_id: int | None = None  # the `stop_token_ids` id that ended it
    # MindIE completions' usage, per token: the batch size of the step that produced it and
    # the microseconds its step request waited in the queue.
    batch_size: list[int] = field(default_factory=list)
    queue_wait_time: list[int] = field(default_factory=list)

    def score(self, length_penalty: float) -> float:
        return self.cumulative_logprob / (max(1, len(self.tokens)) ** length_penalty)

    @property
    def finish_reason(self) -> FinishReason:
        return FinishReason.STOP if self.finished else FinishReason.LENGTH


@dataclass(slots=True)
class _Fetched:
    """One beam's next-token distribution, as far as the engine listed it."""

    entry: Logprob  # the argmax and the top `asked` alternatives, best first
    asked: int
    batch_size: int
    queue_wait_time: int
    cached_tokens: int
    prompt_logprobs: list[Logprob] | None


@dataclass(slots=True)
class _Candidate:
    score: float  # the beam's score plus this round's penalized log-probability
    beam: int
    token: int
    logprob: float  # raw
    ends: bool  # EOS (unless ignore_eos) or a stop token id


class BeamSearch:
    """One prompt's beam search. `run()` returns the `width` best beams, best first; afterwards
    `prompt_logprobs` (when asked) and `cached_tokens` describe the prompt."""

    def __init__(
        self,
        runtime: Runtime,
        prompt_ids: list[int],
        width: int,
        max_tokens: int,
        sampling: SamplingParams | None = None,
        *,
        length_penalty: float = 1.0,
    ) -> None:
        sampling = sampling or SamplingParams()
        self.runtime = runtime
        self.prompt_ids = list(prompt_ids)
        self.width = width
        self.max_tokens = max_tokens
        self.length_penalty = length_penalty
        self.stop_ids = frozenset(sampling.stop_token_ids)
        self.ends = self.stop_ids | (frozenset() if sampling.ignore_eos else frozenset(runtime.eos_token_ids))
        self.presence = sampling.presence_penalty
        self.frequency = sampling.frequency_penalty
        self.repetition = sampling.repetition_penalty
        self.want_logprobs = sampling.logprobs or 0
        self.want_prompt_logprobs = sampling.prompt_logprobs
        self.prompt_set = frozenset(self.prompt_ids) if self.repetition != 1.0 else frozenset()
        info = getattr(runtime, "info", None)
        self.vocab = int(getattr(info, "vocab_size", 0) or len(runtime.tokenizer))
        first = max(2 * width, self.want_logprobs) + len(self.ends)
        if sampling.has_penalties:
            first += 2 * width  # penalized tokens may push the listed ones down
        self.first_ask = min(self.vocab, first)
        self.prompt_logprobs: list[Logprob] | None = None
        self.cached_tokens = 0

    async def run(self) -> list[Beam]:
        width, lp = self.width, self.length_penalty
        live = [Beam()]
        finished: list[Beam] = []
        for step in range(self.max_tokens):
            length = step + 1
            last = length == self.max_tokens
            fetched = await self._fetch_round(live, step == 0)
            ranked = await self._rank(live, fetched, last)
            # Finished: the round's top `width` candidates that end their beam (every one of
            # them on the last round, where max_tokens ends them all).
            for c in ranked[:width]:
                if c.ends or last:
                    finished.append(self._extend(live[c.beam], fetched[c.beam], c, finished=c.ends))
            finished = sorted(finished, key=lambda b: b.score(lp), reverse=True)[:width]
            if last:
                break
            going = [c for c in ranked if not c.ends][:width]
            live = [self._extend(live[c.beam], fetched[c.beam], c, finished=False) for c in going]
            if not live:
                break
            # transformers' early-stop heuristic (early_stopping=False): the best live beam,
            # scored at its current length, can no longer beat the worst of `width` finished.
            if len(finished) == width and not live[0].cumulative_logprob / length**lp > finished[-1].score(lp):
                break
        if len(finished) < width:  # only when the search ran out of continuations
            finished = sorted(finished + live, key=lambda b: b.score(lp), reverse=True)[:width]
        return finished

    def _extend(self, parent: Beam, fetched: _Fetched, c: _Candidate, *, finished: bool) -> Beam:
        entry = Logprob(token_id=c.token, logprob=c.logprob, top=fetched.entry.top[: self.want_logprobs])
        return Beam(
            tokens=parent.tokens + [c.token],
            logprobs=parent.logprobs + [entry],
            cumulative_logprob=c.score,
            finished=finished,
            stop_token_id=c.token if finished and c.token in self.stop_ids else None,
            batch_size=parent.batch_size + [fetched.batch_size],
            queue_wait_time=parent.queue_wait_time + [fetched.queue_wait_time],
        )

    def _penalized(self, token: int, logprob: float, counts: Counter[int]) -> float:
        if self.repetition != 1.0 and (token in counts or token in self.prompt_set):
            logprob = logprob * self.repetition if logprob < 0 else logprob / self.repetition
        count = counts.get(token, 0)
        if count:
            logprob -= self.presence + self.frequency * count
        return logprob

    async def _rank(self, live: list[Beam], fetched: list[_Fetched], last: bool) -> list[_Candidate]:
        """Every listed candidate, best first, once the list provably holds the round's top
        `width` candidates and its top `width` that do not end their beam."""
        counts = [Counter(b.tokens) for b in live]
        while True:
            ranked: list[_Candidate] = []
            for b, (beam, got) in enumerate(zip(live, fetched)):
                for token, logprob in got.entry.top:
                    score = beam.cumulative_logprob + self._penalized(token, logprob, counts[b])
                    ranked.append(_Candidate(score, b, token, logprob, token in self.ends))
            ranked.sort(key=lambda c: (-c.score, c.beam, c.token))  # deterministic tie-break
            needed = ranked if last else [c for c in ranked if not c.ends]
            threshold = needed[self.width - 1].score if len(needed) >= self.width else float("-inf")
            again = [
                b
                for b, (beam, got) in enumerate(zip(live, fetched))
                if beam.cumulative_logprob + self._unseen_bound(got, counts[b]) > threshold
            ]
            if not again:
                return ranked
            refetched = await self._fetch([live[b] for b in again], [min(self.vocab, 2 * fetched[b].asked) for b in again], False)
            for b, got in zip(again, refetched):
                # The step that produced the token stays the one the usage reports.
                got.batch_size, got.queue_wait_time = fetched[b].batch_size, fetched[b].queue_wait_time
                fetched[b] = got

    def _unseen_bound(self, got: _Fetched, counts: Counter[int]) -> float:
        """An upper bound on the penalized log-probability of any token the engine did not list."""
        top = got.entry.top
        if got.asked >= self.vocab or len(top) < got.asked or not top:
            return float("-inf")  # the whole vocabulary is listed
        floor = top[-1][1]  # an unlisted token's raw log-probability is at most this
        bound = floor
        if not (self.presence or self.frequency or self.repetition != 1.0):
            return bound
        listed = {t for t, _ in top}
        for token in counts:
            if token not in listed:
                bound = max(bound, self._penalized(token, floor, counts))
        if self.repetition < 1.0 and any(t not in listed and t not in counts for t in self.prompt_set):
            bound = max(bound, floor * self.repetition if floor < 0 else floor / self.repetition)  # a prompt token
        return bound

    async def _fetch_round(self, live: list[Beam], first: bool) -> list[_Fetched]:
        got = await self._fetch(live, [self.first_ask] * len(live), first)
        if first:
            self.prompt_logprobs = got[0].prompt_logprobs
            self.cached_tokens = got[0].cached_tokens
        return got

    async def _fetch(self, beams: list[Beam], asks: list[int], with_prompt_logprobs: bool) -> list[_Fetched]:
        out: list[_Fetched | None] = [None] * len(beams)

        async def one(i: int) -> None:
            params = SamplingParams(
                temperature=0.0,
                max_tokens=1,
                ignore_eos=True,
                logprobs=asks[i],
                prompt_logprobs=self.want_prompt_logprobs if with_prompt_logprobs else None,
            )
            entry = usage = prompt_logprobs = None
            async with self.runtime.submit(Prompt(token_ids=self.prompt_ids + beams[i].tokens), params) as stream:
                async for delta in stream:
                    if delta.logprobs:
                        entry = delta.logprobs[0]
                    if delta.prompt_logprobs is not None:
                        prompt_logprobs = delta.prompt_logprobs
                    if delta.usage is not None:
                        usage = delta.usage
            assert entry is not None, "a beam step returned no logprobs"
            out[i] = _Fetched(
                entry=entry,
                asked=asks[i],
                batch_size=usage.batch_size[0] if usage is not None and usage.batch_size else 1,
                queue_wait_time=usage.queue_wait_time[0] if usage is not None and usage.queue_wait_time else 0,
                cached_tokens=usage.cached_tokens if usage is not None else 0,
                prompt_logprobs=prompt_logprobs,
            )

        async with unwrapped_errors(), trio.open_nursery() as nursery:
            for i in range(len(beams)):
                nursery.start_soon(one, i)
        got = [f for f in out if f is not None]
        assert len(got) == len(out), "every beam's request returned"
        return got


@asynccontextmanager
async def unwrapped_errors() -> AsyncIterator[None]:
    """trio wraps a child task's error in an ExceptionGroup; callers (the error handlers, the
    Databricks wrapper) expect the ServingError itself (a 400 naming the field, a 429, ...)."""
    try:
        yield
    except BaseExceptionGroup as group:
        error = _first_serving_error(group)
        if error is None:
            raise
        raise error from None


def _first_serving_error(group: BaseExceptionGroup) -> ServingError | None:
    for exc in group.exceptions:
        found = _first_serving_error(exc) if isinstance(exc, BaseExceptionGroup) else exc if isinstance(exc, ServingError) else None
        if found is not None:
            return found
    return None


async def beam_search(
    runtime: Runtime,
    prompt_ids: list[int],
    width: int,
    max_tokens: int,
    *,
    sampling: SamplingParams | None = None,
    ignore_eos: bool | None = None,
    length_penalty: float = 1.0,
) -> list[Beam]:
    """The `width` best beams, best first. `sampling` carries stop_token_ids, ignore_eos, the
    penalties and logprobs (its sampling fields are not used: the search is deterministic)."""
    sampling = sampling or SamplingParams()
    if ignore_eos is not None:
        sampling = msgspec.structs.replace(sampling, ignore_eos=ignore_eos)
    return await BeamSearch(runtime, prompt_ids, width, max_tokens, sampling, length_penalty=length_penalty).run()
