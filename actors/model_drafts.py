"""Speculative decoding's drafts from a draft model (--spec-decoding draft). Pure: no torch, no trio.

Owns: `ModelDrafter`, the scheduler's side of a draft model. Which requests draft, and how many
tokens, is decided exactly as for n-gram drafts (actors/drafting.py: `attach_drafts`, with its
exclusions, and `Drafter.worth`, from the step cost fit and the request's acceptance so far);
only the tokens differ. The core cannot know them: the draft model runs in the runner, on the
device thread, in the step itself. So a draft here is `k` DRAFT_TOKEN placeholders, which
reserve the draft's positions and KV blocks as an n-gram draft's tokens do; the runner fills
them (actors/runners/draft_model.py) and returns what it drafted (`StepResult.drafted`), and the
core keeps `drafted[:accepted]`.

What a draft costs: the draft model's forward over each step's tokens is paid by every step,
drafting or not (its KV cache must follow the target's), so the step cost fit already holds it.
A draft of k tokens adds k - 1 one-row draft decodes, and one more when the whole draft is kept
(the last draft token's KV; actors/runners/draft_model.py says why). The runner times those
(`StepResult.draft_seconds`); the core teaches the fit each step without them, and this drafter
charges a draft of k tokens (k - 1 + acceptance^k) of them in `worth`. A step's draft decodes
are batched over its drafting rows, so a row pays its share of each: the forward's time over
the step's decoding rows, as if all of them drafted (`worth` judges each row alike; charged the
whole forward, every row of a wide step came out not worth drafting, where all of them were).
"""

from __future__ import annotations

from actors.drafting import Drafter
from actors.sequence import Sequence
from actors.step_cost import StepCostModel
from runtime.messages import DRAFT_TOKEN, StepPlan, StepResult

FORWARD_WEIGHT = 0.3  # the moving average's weight of the latest step's draft forwards


class ModelDrafter(Drafter):
    def __init__(self, max_tokens: int, max_rows: int | None = None) -> None:
        super().__init__(max_tokens, max_rows)
        self.forward_seconds: float | None = None  # one draft decode forward, as measured (None: none yet)

    def propose(self, seq: Sequence, k: int) -> list[int]:
        """`k` slots for the runner's draft model to fill."""
        return [DRAFT_TOKEN] * k

    def observe(self, forwards: int, seconds: float) -> None:
        """A step's draft decode forwards and the seconds they took."""
        if forwards <= 0 or seconds <= 0:
            return
        latest = seconds / forwards
        previous = self.forward_seconds
        self.forward_seconds = latest if previous is None else (1 - FORWARD_WEIGHT) * previous + FORWARD_WEIGHT * latest

    def worth(self, cost: StepCostModel, rows: int, request_id: str) -> int:
        """As n-gram drafts' (`Drafter.worth`), the draft model's own forwards counted in. Until
        one has been timed they count nothing: draft, and let the measured forwards decide."""
        if not self.forward_seconds:
            return super().worth(cost, rows, request_id)
        share = self.forward_seconds / max(rows, 1)  # its share of the batched forward: the rows are judged alike
        return super().worth(_WithDraftForwards(cost, share, self.acceptance(request_id)), rows, request_id)


class _WithDraftForwards(StepCostModel):
    """The step cost fit's prediction plus a k-token draft's own draft forwards. Only `predict`
    and `predict_verify` answer (all `Drafter.worth` asks); the fit itself stays the core's."""

    def __init__(self, fit: StepCostModel, forward_seconds: float, acceptance: float) -> None:  # no super(): it holds no steps
        self._inner = fit
        self._forward_seconds = forward_seconds
        self._acceptance = acceptance

    def predict(self, decode_rows: int, prefill_tokens: int) -> float | None:
        seconds = self._inner.predict(decode_rows, prefill_tokens)
        return None if seconds is None else seconds + self._forwards(prefill_tokens)

    def predict_verify(self, decode_rows: int, draft_tokens: int) -> float | None:
        seconds = self._inner.predict_verify(decode_rows, draft_tokens)
        return None if seconds is None else seconds + self._forwards(draft_tokens)

    def _forwards(self, draft_tokens: int) -> float:
        """The draft model's seconds for a draft of `draft_tokens`."""
        if draft_tokens <= 0:
            return 0.0
        forwards = draft_tokens - 1 + self._acceptance**draft_tokens  # the last draft token's KV when all are kept
        return forwards * self._forward_seconds


def observe_step(fit: StepCostModel, drafter: Drafter | None, plan: StepPlan, result: StepResult, seconds: float) -> None:
    """A step that ran: the fit learns it without the draft model's draft decodes, which a
    model drafter learns on its own (with no draft model there are none). A step that verified
    drafts is not learnt at all: its verify rows are neither decode rows nor prompt tokens, and
    learnt as prompt tokens they shrank the prompt allowance of the steps after them (auto's
    grounded c = 64 cell, docs/performance.md)."""
    if not any(s.num_draft_tokens for s in plan.seqs):
        fit.observe(plan.num_decode_rows, plan.num_prefill_tokens, seconds - result.draft_seconds)
    if isinstance(drafter, ModelDrafter):
        drafter.observe(result.draft_forwards, result.draft_seconds)
