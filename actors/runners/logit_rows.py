"""Which rows of a packed step get logits, and the draws and logprobs made from them.

Owns: `LogitRows` (the kept positions of a step, what each is for: a sampled token, a fork's
token from its parent's row, prompt logprobs, a forced token's logprobs) and `Draw`, one token
to sample. Model-agnostic: both model paths (native and transformers) hand the runner logits
for exactly these rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from actors.runners.request_state import RequestState, RequestStates
from actors.runners.sampler import top_logprobs
from runtime.messages import Logprob, ScheduledSeq


@dataclass(slots=True)
class Draw:
    """One token to sample: a sequence's own, or a forked sibling's from the same logits row."""

    request_id: str
    seq: ScheduledSeq  # whose logits and sampling parameters
    row: int  # its row in the kept logits
    seed: int
    state: RequestState  # its history and grammar matcher, aligned to the first draw's position
    position: int  # the index of the token being generated
    # A verify row of a draft (speculative decoding): the draft tokens before this row's position
    # (its penalties count them) and, unless it is the row after the whole draft, the draft
    # token this row checks. A plain draw has neither.
    prefix: tuple[int, ...] = ()
    checks: int | None = None

    @property
    def matcher(self) -> Any:
        """The grammar matcher when it constrains this token (not while the request thinks)."""
        return self.state.live_matcher(self.seq.sampling.thinking)


class LogitRows:
    """Which positions of the packed step get logits, and what each row is for.

    A sampling sequence needs its last position (so do its forks). A sequence asking for prompt
    logprobs needs every position of its chunk (position p's distribution scores token p + 1).
    Tokens the core forced (`ScheduledSeq.forced_ids`) need the rows before them: the model's
    distribution at their positions, which never sampled them.
    """

    def __init__(self) -> None:
        self.index: list[int] = []  # packed-step positions passed to logits_to_keep
        self.draws: list[Draw] = []
        self.prompt_rows: dict[int, tuple[int, int]] = {}  # seq → (first kept row, count)
        self.forced_rows: dict[int, list[int]] = {}  # seq → the kept row scoring each of its forced tokens
        self._wanted: dict[int, int] = {}

    @classmethod
    def plan(cls, seqs: tuple[ScheduledSeq, ...], states: RequestStates) -> "LogitRows":
        rows = cls()
        cursor = 0
        for i, s in enumerate(seqs):
            end = cursor + len(s.token_ids)
            forced = [s.forced_pos + j - 1 - s.start_pos for j in range(len(s.forced_ids))]  # fed offsets of their rows
            if s.sampling.prompt_logprobs is not None and s.start_pos < s.num_prompt_tokens:
                rows.prompt_rows[i] = (len(rows.index), len(s.token_ids))
                if forced:
                    rows.forced_rows[i] = [len(rows.index) + offset for offset in forced]
                rows.index.extend(range(cursor, end))
            else:
                if forced:  # before the sampling rows: the last row samples, never scores a forced token
                    rows.forced_rows[i] = list(range(len(rows.index), len(rows.index) + len(forced)))
                    rows.index.extend(cursor + offset for offset in forced)
                if s.sample:
                    rows.index.extend(range(end - 1 - s.num_draft_tokens, end))  # a draft's verify rows too
            if s.sample and s.num_draft_tokens:
                rows.draws += _verify_draws(s, len(rows.index) - 1 - s.num_draft_tokens, states)
            elif s.sample:
                row, position = len(rows.index) - 1, s.start_pos + len(s.token_ids)
                rows.draws.append(Draw(s.request_id, s, row, s.seed, states.align(s.request_id, position), position))
                for fork in s.forks or ():
                    rows.draws.append(Draw(fork.request_id, s, row, fork.seed, states.align(fork.request_id, position), position))
            cursor = end
        return rows

    def logprob_rows(self) -> list[int]:
        wanted: list[int] = []
        for first, count in self.prompt_rows.values():
            wanted.extend(range(first, first + count))
        seen = set(wanted)
        for i, forced in self.forced_rows.items():
            if i not in self.prompt_rows:  # else kept already
                wanted.extend(forced)
                seen.update(forced)
        for d in self.draws:  # forks share their parent's row
            if d.seq.sampling.logprobs is not None and d.row not in seen:
                wanted.append(d.row)
                seen.add(d.row)
        self._wanted = {row: j for j, row in enumerate(wanted)}
        return wanted

    def collect_logprobs(
        self, seqs: tuple[ScheduledSeq, ...], states: RequestStates, logprobs: torch.Tensor, sampled: dict[str, int], kept: dict[str, int] | None = None
    ) -> dict[str, list[Logprob]]:
        """Prompt logprobs, then the forced tokens', then the new tokens' (a kept draft's, then
        the sampled one), per request. One gather for all values;
        top-k once per distinct width, over the rows that asked for it (a beam re-asking for a
        wide k must not make every other row pay for it)."""
        wanted: list[tuple[str, int, int, int]] = []  # (request id, kept row, token, width)
        for i, (first, count) in self.prompt_rows.items():
            s = seqs[i]
            history = states.get(s.request_id).history
            for offset in range(count):
                pos = s.start_pos + offset + 1  # the token this row's distribution scores
                if pos < s.num_prompt_tokens:
                    wanted.append((s.request_id, first + offset, history[pos], s.sampling.prompt_logprobs or 0))
        for i, forced in self.forced_rows.items():
            s = seqs[i]
            wanted += [(s.request_id, row, token, s.sampling.logprobs or 0) for row, token in zip(forced, s.forced_ids)]
        for d in self.draws:
            if d.seq.sampling.logprobs is None or d.request_id not in sampled:
                continue
            j, num_kept = len(d.prefix), (kept or {}).get(d.request_id, 0)  # a verify row's place in its draft
            if j <= num_kept:  # rows past the first mismatch gave no token
                wanted.append((d.request_id, d.row, d.checks if j < num_kept and d.checks is not None else sampled[d.request_id], d.seq.sampling.logprobs))
        if not wanted:
            return {}
        js = [self._wanted[row] for _, row, _, _ in wanted]
        values = logprobs[js, [token for _, _, token, _ in wanted]].tolist()
        tops: dict[tuple[int, int], list[tuple[int, float]]] = {}  # (row, width) -> top entries
        by_width: dict[int, dict[int, None]] = {}  # width -> its rows, in order, once each
        for (_, _, _, width), j in zip(wanted, js):
            if width > 0:
                by_width.setdefault(width, {})[j] = None
        for width, row_set in by_width.items():
            rows = list(row_set)
            ids, vals = top_logprobs(logprobs[rows], width)
            for j, row_ids, row_vals in zip(rows, ids, vals):
                tops[(j, width)] = list(zip(row_ids, row_vals))
        out: dict[str, list[Logprob]] = {}
        for (request_id, _, token, width), j, value in zip(wanted, js, values):
            top = tops.get((j, width), [])
            out.setdefault(request_id, []).append(Logprob(token_id=token, logprob=value, top=top))
        return out


def _verify_draws(s: ScheduledSeq, first_row: int, states: RequestStates) -> list[Draw]:
    """One draw per verify row of `s`'s draft: row j samples the token after the fed tokens and
    the draft's first j, exactly as the step-by-step loop would sample that position."""
    k = s.num_draft_tokens
    draft = tuple(s.token_ids[len(s.token_ids) - k :])
    position = s.start_pos + len(s.token_ids) - k
    state = states.align(s.request_id, position)
    return [
        Draw(s.request_id, s, first_row + j, s.seed, state, position + j, prefix=draft[:j], checks=draft[j] if j < k else None)
        for j in range(k + 1)
    ]
