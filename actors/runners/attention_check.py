"""The transformers path checked at start against the model's own attention.

Owns `check_attention`: a short probe prompt runs through the paged attention the path serves
with (a fresh prompt chunk, a chunk after cached tokens, then decode rows) and through the
model's own eager attention, with no cache; the largest difference of a position's
log-probabilities must be within `BOUNDS` for the dtype, or the model is refused at start
(`ModelRefused`, one line). The paged attention is causal, grouped and scaled, nothing more:
an architecture whose attention is more (ALiBi, sinks, softcapping, a custom mask or scale)
would otherwise serve silently wrong text. Bounds: float32 the same sums in another order;
bf16 the noise of the same check on native families run through this path (docs/models.md).
"""

from __future__ import annotations

from typing import Any

import torch

from runtime.errors import ModelRefused

PROBE = 40  # tokens: a 16-token fresh chunk, a 16-token chunk after it, 8 decode rows
BOUNDS = {torch.float32: 1e-3, torch.bfloat16: 0.25, torch.float16: 0.1}  # nats


def probe_tokens(vocab_size: int) -> list[int]:
    return [1 + (97 * i + 13) % max(1, min(vocab_size, 32_000) - 1) for i in range(PROBE)]


def paged_logprobs(path: Any, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], block_size: int, tokens: list[int]) -> torch.Tensor:
    """The probe's log-probabilities at every position, served in steps as the engine would."""
    from actors.runners import paged_attention

    device = k_cache[0].device
    table = list(range(-(-len(tokens) // block_size)))
    chunk = max(2, 2 * len(tokens) // 5)  # 16 of 40; a cache of fewer slots takes a shorter probe
    spans = [(0, chunk), (chunk, chunk)] + [(p, 1) for p in range(2 * chunk, len(tokens))]
    rows = []
    for start, count in spans:
        step, positions = paged_attention.build_step([(start, count)], [table], block_size, k_cache, v_cache)
        ids = torch.tensor(tokens[start : start + count], dtype=torch.long, device=device)
        keep = torch.arange(count, dtype=torch.long, device=device)
        rows.append(path.forward(ids, positions, step, keep, k_cache, v_cache).float())
        if step.layers_seen != path.num_layers:
            raise Unpaged(f"its {path.num_layers} layers called the paged attention {step.layers_seen} times a step")
    return torch.log_softmax(torch.cat(rows), dim=-1)


class Unpaged(Exception):
    """The model's modules run their own attention, not the one transformers' interface names."""


def eager_logprobs(path: Any, tokens: list[int], device: torch.device) -> torch.Tensor:
    """The probe through the model's own eager attention (its masks, windows, scales and all):
    the whole model, or a vision-language model's text tower and head (`path.text`), whose
    switch leaves the vision tower's attention as it was."""
    text = getattr(path, "text", None)
    model = text if text is not None else path.model
    served = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        ids = torch.tensor([tokens], dtype=torch.long, device=device)
        if text is None:
            return torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0].float(), dim=-1)
        return torch.log_softmax(path.lm_head(model(input_ids=ids, use_cache=False).last_hidden_state[0]).float(), dim=-1)
    finally:
        model.set_attn_implementation(served)


def check_attention(path: Any, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], block_size: int, name: str) -> float:
    """The largest |difference| of log-probabilities (nats); ModelRefused past the dtype's bound."""
    tokens = probe_tokens(path.vocab_size)[: k_cache[0].shape[1]]
    dtype = k_cache[0].dtype
    with torch.inference_mode():
        try:
            served = paged_logprobs(path, k_cache, v_cache, block_size, tokens)
            own = eager_logprobs(path, tokens, k_cache[0].device)
        except Exception as exc:  # an architecture whose modules do not take the paged attention
            raise refused(name, exc) from exc
    worst = float((served - own).abs().max())
    bound = BOUNDS.get(dtype, BOUNDS[torch.bfloat16])
    if not worst <= bound:
        raise ModelRefused(
            f"{name}: its attention is not served right on the paged attention (log-probabilities {worst:.3g} nats from the model's own eager attention "
            f"on a {PROBE}-token probe, bound {bound:g} in {str(dtype).removeprefix('torch.')}); it has something the paged attention lacks (ALiBi, sinks, softcapping, a custom mask)"
        )
    return worst


def refused(name: str, why: BaseException) -> ModelRefused:
    """A model whose transformers modules do not run on the paged attention (they compute their
    own, as Bloom's and Falcon's do, or fail on it): one line."""
    detail = str(why) if isinstance(why, Unpaged) else f"{type(why).__name__}: {why}"
    return ModelRefused(f"{name}: transformers' modules for this architecture do not run on the paged KV cache's attention ({detail})".split("\n")[0])
