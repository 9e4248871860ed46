"""Admission rules, each written once: when a runtime is full (`max_pending`), what a
request is charged against `max_pending_tokens` before it is tokenized, and the token budget
itself.

`is_full` and `TokenBudget.spent` are applied by `Runtime.open` to every request and by the
API edge's load shedding (api/http/shared/admission.py) before a body is read; `estimate_tokens` and
`TokenBudget.refuses` by `Runtime.open`, since they need the request's body. Pure: no trio, no
tokenizer.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from runtime.request import Prompt
from runtime.sampling import SamplingParams


def is_full(live: int, max_pending: int, n: int = 1) -> bool:
    """Whether a runtime with `live` admitted, unfinished requests cannot take `n` more."""
    return live + n > max_pending


def estimate_tokens(prompt: Prompt, sampling: SamplingParams, max_model_len: int, tokens_per_image: int = 0) -> int:
    """What admission charges a request, before it is tokenized: prompt + tokens to generate.

    Text counts 1 token per 4 UTF-8 bytes (plus 4 per chat message for role markers); token
    ids count exactly; each image counts `tokens_per_image` (the model's most for one image).
    Without max_tokens the request may run to the context length. Capped at
    `max_model_len`: one request never holds more than a full context.
    """
    if prompt.token_ids is not None:
        num_prompt = len(prompt.token_ids)
    elif prompt.messages is not None:
        num_prompt = sum(4 + _text_bytes(m.get("content")) // 4 for m in prompt.messages) + len(prompt.images) * tokens_per_image
    else:
        num_prompt = _text_bytes(prompt.text) // 4 + 1
    num_new = sampling.max_tokens if sampling.max_tokens is not None else max_model_len - num_prompt
    return max(1, min(max_model_len, num_prompt + max(0, num_new)))


def _text_bytes(content: Any) -> int:
    if isinstance(content, str):
        return len(content.encode())
    if isinstance(content, list):  # content parts
        return sum(_text_bytes(part.get("text") if isinstance(part, dict) else part) for part in content)
    return 0


class TokenBudget:
    """`max_pending_tokens`: the admission estimates of live requests against a budget.

    Costs are charged when a request is admitted and forgotten lazily once it is no longer
    live (the runtime's `requests` is the one record of what is live)."""

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self._costs: dict[str, int] = {}  # request id -> its admission estimate

    def charge(self, request_id: str, cost: int) -> None:
        self._costs[request_id] = cost

    def pending(self, live: Collection[str]) -> int:
        """Estimated tokens of the `live` requests (0 without a budget). O(live)."""
        if len(self._costs) > 2 * len(live) + 64:  # forget finished requests' costs
            self._costs = {rid: c for rid, c in self._costs.items() if rid in live}
        return sum(self._costs.get(rid, 0) for rid in live)

    def refuses(self, pending: int, cost: int) -> bool:
        """Whether a request costing `cost` must wait. A lone request is always admitted, so
        one larger than the budget is not refused forever."""
        return self.budget is not None and pending > 0 and pending + cost > self.budget

    def spent(self, live: Collection[str]) -> bool:
        """Whether the budget refuses every request now, whatever its size (each costs at least
        1): the edge sheds on this before reading a body."""
        if self.budget is None:
            return False
        pending = self.pending(live)
        return pending > 0 and pending >= self.budget
