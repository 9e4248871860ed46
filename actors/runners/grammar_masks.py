"""A step's grammar masks: which tokens each guided draw may sample, and each draw's token
taken by its matcher.

Owns: `GrammarMasks` (the helper thread llguidance fills a packed bitmask on while the forward
runs, and the unpacking of it on the device thread) and `consume` (a sampled or kept draft
token into the draw's matcher and history). A draft's verify rows are each masked by the
matcher advanced over the draft tokens before them (llguidance's draft-token fill, which rolls
the matcher back after), so a guided request drafts and still gets its step-by-step tokens.

Allocating and unpacking the mask are torch ops and stay on the device thread: torch work on a
second long-lived thread would give it an OpenMP team of its own (runtime/thread_bridge.py says
why that is slow). llguidance releases the GIL and runs no torch kernel, so it may fill the
mask beside the forward.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from actors.runners.logit_rows import Draw
from actors.runners.sampler import unpack_bitmask

Guided = list[tuple[int, Any]]  # (draw index, its live matcher), one per mask row


class PendingMasks:
    """One step's masks, filling on the helper thread."""

    def __init__(self, guided: Guided, bitmask: torch.Tensor, errors: Future[dict[int, str]]) -> None:
        self.guided = guided
        self.bitmask = bitmask
        self.errors = errors


class GrammarMasks:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="switchyard-masks")
        self._executor: Any = None  # llguidance's, made on the helper thread when first needed

    def start(self, draws: list[Draw]) -> PendingMasks | None:
        """Begin filling the masks of `draws` that a grammar constrains (None: no such draw)."""
        guided = [(i, d.matcher) for i, d in enumerate(draws) if d.matcher is not None]
        if not guided:
            return None
        import llguidance.torch

        bitmask = llguidance.torch.allocate_token_bitmask(len(guided), self.vocab_size)
        return PendingMasks(guided, bitmask, self._pool.submit(self._fill, guided, _tasks(draws, guided), bitmask))

    def allowed(self, pending: PendingMasks) -> tuple[torch.Tensor, dict[int, str]]:
        """Allowed tokens `[G, V]` per guided draw, and the draws that fail: a broken matcher, or
        a grammar that allows nothing."""
        broken = pending.errors.result()
        allowed = unpack_bitmask(pending.bitmask, self.vocab_size)
        empty = (~allowed.any(dim=-1)).tolist()  # one reduction and one sync for every row
        for j, (i, _) in enumerate(pending.guided):
            if i in broken or empty[j]:
                broken.setdefault(i, "the grammar allows no next token")
                allowed[j] = True  # keeps the batched sampling well-defined; the draw is dropped
        return allowed, broken

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _fill(self, guided: Guided, tasks: list[tuple[Any, int, list[int]]], bitmask: torch.Tensor) -> dict[int, str]:
        """Helper thread: each guided draw's allowed tokens into `bitmask`; the draws whose
        matcher is broken (they fail; the rest of the step goes on)."""
        import llguidance
        import llguidance.torch

        if self._executor is None:
            self._executor = llguidance.LLExecutor(num_threads=1)
        try:
            plain = [(matcher, row) for matcher, row, draft in tasks if not draft]
            drafted = [task for task in tasks if task[2]]
            if plain:
                llguidance.torch.fill_next_token_bitmask_par(self._executor, plain, bitmask)
            if drafted:  # llguidance refuses an empty draft, so these go apart
                llguidance.torch.fill_next_token_bitmask_par_with_draft_tokens(self._executor, drafted, bitmask)
        except Exception as exc:  # the batch call raised instead of flagging one matcher: fail the guided draws, not the step
            return {i: f"grammar mask failed: {exc}" for i, _ in guided}
        return {i: matcher.get_error() for i, matcher in guided if matcher.is_error()}


def _tasks(draws: list[Draw], guided: Guided) -> list[tuple[Any, int, list[int]]]:
    """llguidance's mask jobs for the guided draws: (matcher, its first mask row, the draft its
    next rows follow). A draft's verify draws are consecutive and share one matcher: the first
    carries the whole draft, and its k + 1 rows are filled from it; a plain draw has none."""
    tasks: list[tuple[Any, int, list[int]]] = []
    row = 0
    while row < len(guided):
        i, matcher = guided[row]
        draw = draws[i]
        draft = list(draw.seq.token_ids[-draw.seq.num_draft_tokens :]) if draw.checks is not None and not draw.prefix else []
        tasks.append((matcher, row, draft))
        row += len(draft) + 1
    return tasks


def consume(draw: Draw, token: int, failed: dict[str, str]) -> bool:
    """`token` becomes `draw`'s: its grammar matcher (if live) takes it, then its history.
    False, with the request failed, when the grammar refuses it.

    A finished grammar takes nothing more: a draft's verify rows go on past a kept token that
    completed it (the end of text), and what they sample lies past the request's end, which
    the scheduler drops (it finishes the request at that token), so it never reaches the
    matcher (which would refuse it and fail a request that ended well)."""
    matcher = draw.matcher
    if matcher is not None and matcher.is_stopped():
        draw.state.history.append(token)
        return True
    if matcher is not None:
        try:
            if not matcher.consume_token(token):
                failed[draw.request_id] = f"grammar error: token {token} rejected: {matcher.get_error()}"
        except Exception as exc:
            failed[draw.request_id] = f"grammar error: {type(exc).__name__}: {exc}"
        if draw.request_id in failed:
            return False
    draw.state.history.append(token)
    return True
