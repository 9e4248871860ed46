"""The oracle of the generation-control tests: the served checkpoint in transformers.

`Reference` is the served checkpoint loaded with transformers in float32: every behavioural
check (greedy continuations, logprobs, penalized argmax) is computed from its raw logits and
compared with what the server returned. Run its work with `waiting.in_thread`: the server
shares the test's trio loop and keeps serving meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

TOL = 1e-3  # float32 engine vs float32 transformers


@dataclass
class Reference:
    tokenizer: Any
    model: Any

    @property
    def eos(self) -> int:
        return int(self.tokenizer.eos_token_id)

    def encode(self, text: str) -> list[int]:
        """As the server encodes a completions prompt (this tokenizer adds no BOS)."""
        return list(self.tokenizer.encode(text, add_special_tokens=True))

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    @torch.inference_mode()
    def logits(self, ids: list[int]) -> torch.Tensor:
        """Raw next-token logits `[len(ids), V]`: row i scores the token after ids[i]."""
        return self.model(torch.tensor([ids])).logits[0].float()

    def logprobs(self, ids: list[int]) -> torch.Tensor:
        return torch.log_softmax(self.logits(ids), dim=-1)

    def greedy(
        self, ids: list[int], k: int, penalty: Callable[[torch.Tensor, list[int], int], torch.Tensor] | None = None
    ) -> list[int]:
        """k greedy tokens (EOS not special), optionally argmax of penalty(logits, history, n_prompt)."""
        seq = list(ids)
        for _ in range(k):
            row = self.logits(seq)[-1]
            if penalty is not None:
                row = penalty(row, seq, len(ids))
            seq.append(int(row.argmax()))
        return seq[len(ids) :]
