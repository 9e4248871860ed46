"""Reasoning models for tests: tiny random Qwen3-shaped models with thinking chat templates, and a
scripted runner that thinks and answers on cue.

Two template shapes, as the real ones are:
- `QWEN3_TEMPLATE` (Qwen3): the model opens `<think>` itself; `enable_thinking=False` renders
  an empty `<think>\\n\\n</think>\\n\\n` after the generation prompt; an assistant turn after
  the last user message renders its `reasoning_content`, earlier ones drop it;
- `OPEN_TEMPLATE` (Qwen3-Thinking-2507, DeepSeek-R1-0528): the generation prompt ends with
  `<think>\\n`; no switch; history's thinking is dropped.
The tokenizer has `<think>`, `</think>`, `<tool_call>` and `</tool_call>` as whole, non-special
tokens (shown in decoded text), as Qwen3's has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.messages import StepPlan, StepResult
from tests.support.fakes import FakeRunner

THINK_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")

QWEN3_TEMPLATE = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}"
    "{% set content = m['content'] or '' %}{% set reasoning = m.get('reasoning_content') or '' %}"
    "{% if '</think>' in content %}{% set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "{% if loop.index0 > ns.last_user and reasoning %}"
    "<|im_start|>assistant\n<think>\n{{ reasoning.strip('\\n') }}\n</think>\n\n{{ content }}<|im_end|>\n"
    "{% else %}<|im_start|>assistant\n{{ content }}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)

OPEN_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|im_start|>assistant\n{{ (m['content'] or '').split('</think>')[-1].lstrip('\\n') }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


def build_thinking_model(path: Path, template: str = QWEN3_TEMPLATE, **config: object) -> Path:
    """A tiny random Qwen3 with a thinking template and its tags as whole tokens."""
    from tests.support.tiny_model import build_tiny_decoder

    return build_tiny_decoder(path, "qwen3", tokenizer_options={"added": THINK_TOKENS, "template": template}, **config)


class ThinkingRunner(FakeRunner):
    """A FakeRunner whose next token follows a request's output so far: `think` (token ids)
    over and over while it thinks, then `answer` once its thinking has ended (`</think>` in its
    output, written by it or forced by a budget), then EOS. With `opens`, the first token is
    `<think>` (a template that lets the model open it), after `lead` (whitespace, as Qwen3 and
    R1 models may write before it: `\n<think>`)."""

    def __init__(
        self, tokenizer: Any, think: str = " a", answer: str = "ok", thoughts: int | None = None, opens: bool = False, lead: str = "", **kw: Any
    ) -> None:
        super().__init__(vocab_size=len(tokenizer), **kw)
        ids = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        self.start, self.end = ids("<think>")[0], ids("</think>")[0]
        self.think, self.answer, self.eos = ids(think), ids(answer), tokenizer.eos_token_id
        self.newlines = set(ids("\n\n") + ids("\n"))  # what a forced end writes after `</think>`
        self.thoughts = thoughts  # write `</think>` itself after this many thinking tokens (None: never)
        self.opens = opens
        self.lead = ids(lead) if opens else []
        self.prompts: list[list[int]] = []  # every prompt it sampled after, as the history holds it

    def execute(self, plan: StepPlan) -> StepResult:
        self.requests.apply(plan)
        sampled = {}
        for seq in plan.seqs:
            fed = self.requests.input_ids(seq)  # every row's, as the torch runner: a chunk of forced tokens joins the history
            if seq.sample:
                state = self.requests.align(seq.request_id, seq.start_pos + len(fed))
                prompt = state.history[: state.num_prompt_tokens]
                self.prompts.append(prompt)
                closed = self.end in prompt[-6:]  # the template closed thinking (enable_thinking=False)
                token = self.pick(([self.end] if closed else []) + state.history[state.num_prompt_tokens :])
                state.history.append(token)
                sampled[seq.request_id] = token
        return StepResult(step_id=plan.step_id, sampled=sampled)

    def pick(self, output: list[int]) -> int:
        opening = [*self.lead, self.start] if self.opens else []
        if len(output) < len(opening) and self.end not in output:
            return opening[len(output)]
        if self.end in output:
            after = [t for t in output[output.index(self.end) + 1 :] if t not in self.newlines]
            return self.answer[len(after)] if len(after) < len(self.answer) else self.eos
        thought = len(output) - len(opening)
        if self.thoughts is not None and thought >= self.thoughts:
            return self.end
        return self.think[thought % len(self.think)]


class ScriptedRunner(FakeRunner):
    """A FakeRunner that writes `text`, then EOS, whatever the prompt (a model that does not
    think, whose output may still hold tags)."""

    def __init__(self, tokenizer: Any, text: str, **kw: Any) -> None:
        super().__init__(vocab_size=len(tokenizer), **kw)
        self.script = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]

    def execute(self, plan: StepPlan) -> StepResult:
        self.requests.apply(plan)
        sampled = {}
        for seq in plan.seqs:
            fed = self.requests.input_ids(seq)
            if seq.sample:
                state = self.requests.align(seq.request_id, seq.start_pos + len(fed))
                token = self.script[min(len(state.history) - state.num_prompt_tokens, len(self.script) - 1)]
                state.history.append(token)
                sampled[seq.request_id] = token
        return StepResult(step_id=plan.step_id, sampled=sampled)


def thinking_runtime(model_dir: Path, config: Any = None, script: str | None = None, **runner: Any) -> Any:
    """An Engine on ThinkingRunner with the thinking model's tokenizer (its format detected), or
    on ScriptedRunner writing `script`."""
    from transformers import AutoTokenizer

    from actors.engine import Engine
    from runtime.config import RuntimeConfig

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = config or RuntimeConfig(served_name="thinker", port=0)
    fake = ScriptedRunner(tokenizer, script, **runner) if script is not None else ThinkingRunner(tokenizer, **runner)
    return Engine(config, fake, tokenizer, config.served_name or "thinker", frozenset([tokenizer.eos_token_id]))
