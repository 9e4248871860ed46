"""A multi-tenant shared-prefix chat workload, and its prefix-cache hit rate.

Each tenant has its own system prompt (the same text on every one of its requests, distinct
from every other tenant's from its first words); each request adds a short question of its
own. What a prefix cache can save is the system prompt, so the share of prompt tokens served
from cache (`prompt_tokens_details.cached_tokens` over `prompt_tokens`, summed) measures how
well requests were sent to replicas that already held their tenant's prefix. Used by the Ray
tier's routing test (tests/cluster) and by ops.bench.ray_serve. Pure Python.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

_WORDS = (
    "account audit balance billing branch budget carrier claim client contract courier credit customer delivery "
    "deposit discount dispatch freight invoice ledger license mortgage order parcel payment pension policy premium "
    "quote refund rental route schedule shipment statement subscription supplier tariff ticket transfer warranty"
).split()


def system_prompt(tenant: int, words: int) -> str:
    rng = random.Random(tenant)
    body = " ".join(rng.choice(_WORDS) for _ in range(words))
    return f"Tenant {tenant} rules. You answer questions about {body}."


def requests(tenants: int, count: int, system_words: int, seed: int = 0, model: str | None = None, max_tokens: int = 1) -> list[dict[str, Any]]:
    """`count` chat bodies over `tenants` tenants in a seeded random order."""
    rng = random.Random(seed)
    bodies = []
    for i in range(count):
        tenant = rng.randrange(tenants)
        question = " ".join(rng.choice(_WORDS) for _ in range(4))
        body: dict[str, Any] = {
            "messages": [{"role": "system", "content": system_prompt(tenant, system_words)}, {"role": "user", "content": f"Q{i}: {question}?"}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        if model is not None:
            body["model"] = model
        bodies.append(body)
    return bodies


@dataclass
class HitRate:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0
    ttft_s: list[float] = field(default_factory=list)

    def add(self, usage: dict[str, Any]) -> None:
        self.requests += 1
        self.prompt_tokens += usage.get("prompt_tokens", 0)
        self.cached_tokens += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)

    @property
    def rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
