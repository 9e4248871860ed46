"""A tiny Llama trained in-process to write given answers to given prompts: `build_trained_llama`.

For a format whose own architecture is not served yet (gpt-oss's sinks), a native Llama-shaped
model that writes the family's output for real: a 2-layer model over the prompts' and answers'
tokens only (a compact vocabulary, plus one class of logit 0 that stands for every other token)
is trained with Adam until every answer token leads every other by `margin` nats under greedy
decoding (a few seconds on a CPU); it is then laid into a checkpoint of the tokenizer's whole
vocabulary (the other tokens' output rows zero, so their logit is 0, the margin still holds)
and saved with the tokenizer, as a user's model directory is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

Example = tuple[list[int], list[int]]  # (prompt ids, answer ids)


def build_trained_llama(path: Path, tokenizer: Any, examples: list[Example], eos: list[int], *, margin: float = 6.0, seed: int = 0, max_steps: int = 600) -> Path:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    used = sorted({t for prompt, answer in examples for t in prompt + answer})
    compact = {t: i for i, t in enumerate(used)}
    other = len(used)  # the class every unused token falls in: a zero row
    settings = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=1024, tie_word_embeddings=False, eos_token_id=eos)  # fmt: skip
    torch.manual_seed(seed)
    small = LlamaForCausalLM(LlamaConfig(vocab_size=other + 1, **settings))
    rows = [(torch.tensor([[compact[t] for t in prompt + answer]]), len(prompt), torch.tensor([compact[t] for t in answer])) for prompt, answer in examples]
    optimizer = torch.optim.Adam(small.parameters(), lr=1e-2)
    for _ in range(max_steps):
        loss, worst = torch.zeros(()), float("inf")
        for ids, start, targets in rows:
            logits = small.lm_head(small.model(input_ids=ids).last_hidden_state[0, start - 1 : -1])
            logits[:, other] = 0.0
            loss = loss + torch.nn.functional.cross_entropy(logits, targets)
            rest = logits.detach().clone()
            rest[torch.arange(len(targets)), targets] = -float("inf")
            worst = min(worst, float((logits.detach().gather(1, targets[:, None])[:, 0] - rest.max(1).values).min()))
        if worst >= margin:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    else:
        raise AssertionError(f"the tiny model did not learn its answers: margin {worst:.2f} after {max_steps} steps")
    full = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), **settings))
    state = small.state_dict()
    with torch.no_grad():
        for name, tensor in full.state_dict().items():
            if name in ("model.embed_tokens.weight", "lm_head.weight"):
                tensor.zero_()
                tensor[used] = state[name][:other]
            else:
                tensor.copy_(state[name])
    full.generation_config = GenerationConfig(eos_token_id=eos)
    full.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "trained.json").write_text(json.dumps({"examples": len(examples), "vocabulary": len(used)}))
    return path
