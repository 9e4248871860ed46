"""A draft model for speculative decoding (--spec-decoding draft), in the runner, on the device thread.

Owns: `DraftModel`: the draft's weights (a Llama-family checkpoint on the native path: dense,
eager, in the target's dtype, no compiled step, no CUDA graphs, no quantization: it is meant to
be small), its paged KV cache, and its part of each step (`Drafts`).

Its cache is a second set of K/V tensors shaped for the draft model, with the target's slot
count, read and written through the SAME block tables as the target's. So block allocation,
prefix-cache sharing, copy-on-write block copies and preemption need nothing of their own, as
long as the draft model's KV is valid wherever the target's is: it computes every token the
target computes, in the same step (`propose`, then `finish`).

Why the output does not change: a draft token is the draft model's argmax, a point mass. A
verify row samples its position exactly as the step-by-step loop would (same seed, position,
uniform: logit_rows._verify_draws) and the draft is kept while it equals that sample; for a
point-mass draft that is rejection sampling exactly (accept with probability p(draft), else a
token from the target's own distribution), so every token is the target's, seeded sampling
included. The draft's numerics only decide how many tokens a step keeps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import torch

from actors.runners import paged_attention
from actors.runners.kv_alloc import lazy_zeros
from actors.runners.native import config as native_config
from actors.runners.native import families
from actors.runners.native.path import NativePath
from actors.runners.runner_config import RunnerConfig
from runtime.logging import get_logger
from runtime.messages import DRAFT_TOKEN, ScheduledSeq

log = get_logger("runner")


@dataclass(slots=True)
class Drafts:
    """The draft model's part of one step."""

    seqs: tuple[ScheduledSeq, ...]  # the step's rows, their draft placeholders filled
    fed: list[list[int]]  # each row's tokens to feed the target, likewise
    tokens: dict[str, list[int]] = field(default_factory=dict)  # request id -> its draft
    ends: dict[str, tuple[int, ScheduledSeq]] = field(default_factory=dict)  # request id -> (last draft token's position, row)
    seconds: float = 0.0  # the draft decodes' (not the forward every step runs)
    forwards: int = 0


class DraftModel:
    def __init__(self, model_dir: Path) -> None:
        self.model_dir = Path(model_dir)
        self.path: NativePath | None = None
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []

    def load(self, dtype: torch.dtype, device: torch.device, num_slots: int, block_size: int, vocab_size: int, max_len: int) -> None:
        """The weights, and a cache of `num_slots` slots (the target's) shaped for this model."""
        hf = native_config.load_hf_config(self.model_dir)
        unsupported = families.check(hf)
        if unsupported is not None:
            raise ValueError(f"--draft-model {self.model_dir}: the native path cannot run it ({unsupported})")
        started = time.perf_counter()
        self.path = NativePath(self.model_dir, hf, RunnerConfig(max_model_len=max_len, batch_invariant=False, compile=False, cuda_graphs=False, block_size=block_size), dtype, device)
        if self.path.vocab_size != vocab_size:
            raise ValueError(f"--draft-model {self.model_dir}: {self.path.vocab_size} tokens, the target {vocab_size}: it must share the target's vocabulary")
        shape = (self.path.num_kv_heads, num_slots, self.path.head_dim)
        self.k_cache = [lazy_zeros(shape, dtype, device) for _ in range(self.path.num_layers)]
        self.v_cache = [lazy_zeros(shape, dtype, device) for _ in range(self.path.num_layers)]
        self.block_size, self.device = block_size, device
        kv_bytes = 2 * sum(t.numel() * t.element_size() for t in self.k_cache)
        log.info("draft_model", model=str(self.model_dir), layers=self.path.num_layers, kv_cache_mib=round(kv_bytes / (1 << 20), 1), load_s=round(time.perf_counter() - started, 2))

    def caches(self) -> tuple[torch.Tensor, ...]:
        return (*self.k_cache, *self.v_cache)

    def close(self) -> None:
        self.path, self.k_cache, self.v_cache = None, [], []

    # Before the target's forward the draft model runs over the step's fed tokens (prompt chunks
    # and decodes alike, drafts excluded), which for a drafting row also gives its first draft
    # token; k - 1 one-row decodes give the rest of a k-token draft. The draft tokens are then the
    # row's verify tokens in the target's forward.
    def propose(self, copies: tuple[tuple[int, int], ...], seqs: tuple[ScheduledSeq, ...], fed: list[list[int]]) -> Drafts:
        """Run over the step's fed tokens (after its block copies), and draft for every row
        planned with DRAFT_TOKEN placeholders: the rows and tokens with the drafts in place."""
        if copies:
            paged_attention.copy_blocks(self.k_cache, self.v_cache, list(copies), self.block_size)
        drafting = [i for i, s in enumerate(seqs) if s.num_draft_tokens and s.token_ids[-1] == DRAFT_TOKEN]
        fills = set(drafting)
        counts = [len(tokens) - (s.num_draft_tokens if i in fills else 0) for i, (s, tokens) in enumerate(zip(seqs, fed))]
        cursor, last = 0, {}
        for i, n in enumerate(counts):
            cursor += n
            last[i] = cursor - 1
        ids = [t for tokens, n in zip(fed, counts) for t in tokens[:n]]
        logits = self._forward([(s.start_pos, n) for s, n in zip(seqs, counts)], [s.block_table for s in seqs], ids, [last[i] for i in drafting])
        # Greedy: a draft token is a point mass, for which the verify rows' keep-while-equal rule is exact rejection sampling.
        drafts: dict[int, list[int]] = {i: [token] for i, token in zip(drafting, logits.argmax(-1).tolist())}
        out = Drafts(seqs=seqs, fed=fed)
        started = time.perf_counter()
        for j in range(1, max((seqs[i].num_draft_tokens for i in drafting), default=0)):
            live = [i for i in drafting if seqs[i].num_draft_tokens > j]  # draft token j - 1 (0-based), fed at its position, gives token j
            rows = [(seqs[i].start_pos + counts[i] + j - 1, 1) for i in live]
            logits = self._forward(rows, [seqs[i].block_table for i in live], [drafts[i][-1] for i in live], list(range(len(live))))
            for i, token in zip(live, logits.argmax(-1).tolist()):
                drafts[i].append(token)
            out.forwards += 1
        out.seconds = time.perf_counter() - started
        filled, out.fed = list(seqs), list(fed)
        for i, draft in drafts.items():
            s, n = seqs[i], counts[i]
            filled[i] = msgspec.structs.replace(s, token_ids=[*s.token_ids[:n], *draft])
            out.fed[i] = [*fed[i][:n], *draft]
            out.tokens[s.request_id] = draft
            out.ends[s.request_id] = (s.start_pos + n + len(draft) - 1, s)
        out.seqs = tuple(filled)
        return out

    # The target's verify rows write KV for the whole draft, and the draft model has written it
    # for all but the last draft token: after sampling, a row that kept its whole draft runs one
    # more draft decode over that token, so both caches hold the same positions when the step
    # ends, and a block the prefix cache hands on is whole in both. Draft KV past the kept tokens
    # is overwritten later (a position past the sequence is never attended), as the target's is.
    def finish(self, drafts: Drafts, kept: dict[str, int]) -> dict[str, Any]:
        """After sampling: the last draft token's KV for each row that kept its whole draft (the
        target's verify row computed it, the draft model has not yet); the StepResult's fields."""
        whole = [rid for rid, draft in drafts.tokens.items() if kept.get(rid) == len(draft)]
        if whole:
            started = time.perf_counter()
            rows = [drafts.ends[rid] for rid in whole]
            self._forward([(pos, 1) for pos, _ in rows], [s.block_table for _, s in rows], [drafts.tokens[rid][-1] for rid in whole], [])
            drafts.seconds += time.perf_counter() - started
            drafts.forwards += 1
        return {"drafted": drafts.tokens, "draft_seconds": drafts.seconds, "draft_forwards": drafts.forwards}

    def _forward(self, rows: list[tuple[int, int]], tables: list[list[int]], ids: list[int], keep: list[int]) -> torch.Tensor:
        """One packed forward of the draft model over its own cache; logits of the rows `keep`."""
        assert self.path is not None
        step, positions = self.path.build_step(rows, tables, self.block_size, self.k_cache, self.v_cache)
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        kept = torch.tensor(keep, dtype=torch.long, device=self.device)
        return self.path.forward(input_ids, positions, step, kept, self.k_cache, self.v_cache)
