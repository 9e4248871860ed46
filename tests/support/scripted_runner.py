"""A runner that writes what a model of a given family would: `ScriptedRunner`, and an engine on it.

`answer(prompt_text)` is the whole assistant turn the "model" writes for a prompt (its chat
template's rendering, special tokens and all). The runner writes it token by token, then the
end of text, through the real engine: each token goes through the request's grammar matcher
first, as the torch runner's sampled tokens do. A token the grammar refuses fails the request
(so a grammar that would not let the family's own call through fails the test), unless the
grammar may end there or forces what comes next: then the model ends its turn that way; once
the grammar is finished, its mask leaves the end of text alone, as the torch runner's does. When
the prompt already ends with the start of the answer (a forced call's prefilled opening,
`Guide.prefix`), the runner writes only the rest, as a model would. The prompts it saw are
kept (`prompts`), so a test can read what the template rendered, and each request's prompt and
written ids (`examples`), so a test can train a real model to write the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.config import RuntimeConfig
from runtime.messages import StepPlan, StepResult
from tests.support.fakes import FakeRunner


class ScriptedRunner(FakeRunner):
    def __init__(self, tokenizer: Any, answer: Callable[[str], str], eos: list[int], **kwargs: Any) -> None:
        super().__init__(vocab_size=len(tokenizer), max_model_len=4096, num_kv_blocks=2048, **kwargs)
        self.tokenizer, self.answer, self.eos = tokenizer, answer, eos
        self.scripts: dict[str, list[int]] = {}
        self.prompts: list[str] = []
        self.examples: list[tuple[list[int], list[int]]] = []  # (prompt ids, the ids written for it)

    def _script(self, request_id: str, prompt_ids: list[int]) -> list[int]:
        if request_id not in self.scripts:
            prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
            self.prompts.append(prompt)
            text = self.answer(prompt)
            overlap = next((n for n in range(min(len(text), len(prompt)), 0, -1) if prompt.endswith(text[:n])), 0)
            ids = list(self.tokenizer.encode(text[overlap:], add_special_tokens=False))
            self.scripts[request_id] = ids if ids and ids[-1] in self.eos else [*ids, self.eos[0]]
            self.examples.append((list(prompt_ids), self.scripts[request_id]))
        return self.scripts[request_id]

    def execute(self, plan: StepPlan) -> StepResult:
        self.num_steps += 1
        self.requests.apply(plan)
        sampled: dict[str, int] = {}
        failed: dict[str, str] = {}
        for seq in plan.seqs:
            self.requests.input_ids(seq)
            if not seq.sample:
                continue
            position = seq.start_pos + len(seq.token_ids)
            state = self.requests.align(seq.request_id, position)
            script = self._script(seq.request_id, state.history[: state.num_prompt_tokens])
            done = position - state.num_prompt_tokens
            token = script[min(done, len(script) - 1)]
            matcher = state.live_matcher(seq.sampling.thinking)
            if matcher is not None and matcher.is_stopped():  # a finished grammar's mask leaves the end alone
                token = self.eos[0]
            elif matcher is not None:
                written = token if matcher.validate_tokens([token]) else self._give_way(seq.request_id, matcher, done)
                if written is None or not matcher.consume_token(written):
                    failed[seq.request_id] = f"the grammar refused token {token} ({self.tokenizer.decode([token])!r}) at output position {done}"
                    continue
                token = written
            state.history.append(token)
            sampled[seq.request_id] = token
        return StepResult(step_id=plan.step_id, sampled=sampled, failed=failed)

    def _give_way(self, request_id: str, matcher: Any, done: int) -> int | None:
        """A token the grammar refuses (a second call under parallel_tool_calls: false): the model
        ends its turn where the grammar may end, writes what it forces, or a shorter token the
        refused one starts with, as a masked sampler whose next choices lead to the end would;
        then the end of text. Elsewhere None: the request fails."""
        forced = [self.eos[0]] if matcher.is_accepting() else matcher.compute_ff_tokens()[:1]
        if not forced:  # a shorter token the refused one starts with (`')` where `'),` went on to a second call)
            text = self.tokenizer.decode([self.scripts[request_id][done]])
            shorter = (self.tokenizer.encode(text[:n], add_special_tokens=False) for n in range(len(text) - 1, 0, -1))
            forced = next(([ids[0]] for ids in shorter if len(ids) == 1 and matcher.validate_tokens(ids)), [])
        if not forced:
            return None
        self.scripts[request_id] = [*self.scripts[request_id][:done], forced[0], self.eos[0]]
        return forced[0]


def scripted_engine(tokenizer: Any, answer: Callable[[str], str], eos: list[int], **config: Any) -> Any:
    from actors.engine import Engine

    runner = ScriptedRunner(tokenizer, answer, eos)
    settings = {"served_name": "family", "port": 0, "max_num_batched_tokens": 4096, "drain_timeout": 2.0, **config}
    return Engine(RuntimeConfig(**settings), runner, tokenizer, "family", frozenset(eos))
