"""A stop string completed inside a kept draft (speculative decoding) ends the output there.

With drafts, one step hands the detokenizer several tokens of a request (the kept draft, then
the sampled token). A stop string that one of the first of them completes must end the output
at that token, as it does when tokens come one a step: the text, the token ids, the logprobs
and usage's completion_tokens are exactly those with drafting off, not the whole step's.

The stop strings are picked from the tiny model's own greedy output: a probe run with drafts
records each step's tokens, and each stop string is the shortest text that first appears when
a token inside a multi-token step is decoded. A spy on the detokenizer shows the last step did
carry tokens past the stop (else the case was not exercised).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from actors.detokenizer import DetokenizerActor
from runtime.messages import FinishReason, TokenDelta
from runtime.sampling import SamplingParams
from tests.support.servers import tiny_config
from tests.support.spec import always_draft, generate, running, tokens

PROMPT = [12, 13, 14]  # the tiny model falls into a loop the drafts catch
MAX_TOKENS = 60


def greedy(**options: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0, **options)  # type: ignore[arg-type]


def spy_steps(monkeypatch: pytest.MonkeyPatch) -> list[TokenDelta]:
    """Every token delta the detokenizer gets from the scheduler, in order."""
    seen: list[TokenDelta] = []
    apply = DetokenizerActor._apply

    def spy(self: DetokenizerActor, state: object, item: TokenDelta, now: float) -> None:
        seen.append(item)
        apply(self, state, item, now)  # type: ignore[arg-type]

    monkeypatch.setattr(DetokenizerActor, "_apply", spy)
    return seen


def stop_strings(tokenizer: object, steps: list[list[int]], limit: int) -> list[tuple[int, str]]:
    """(index of the token that completes it, stop string) for tokens inside a multi-token step
    (not its last): the shortest end of the text so far that appears nowhere before."""
    out = tokens_of(steps)
    full = tokenizer.decode(out)  # type: ignore[attr-defined]
    found: list[tuple[int, str]] = []
    start = 0
    for step in steps:
        for g in range(start, start + len(step) - 1):
            text, before = tokenizer.decode(out[: g + 1]), tokenizer.decode(out[:g])  # type: ignore[attr-defined]
            # The token's text is out for sure (no half character waiting for the next token).
            if full.startswith(text) and text != before and not text.endswith("\ufffd"):
                found.append((g, next(text[-m:] for m in range(1, len(text) + 1) if text[-m:] not in text[:-1])))
                break  # one a step
        start += len(step)
    return found[:: max(1, len(found) // limit)][:limit]


@pytest.mark.parametrize("include", [False, True], ids=["stop-left-out", "stop-included"])
async def test_a_stop_string_inside_a_kept_draft_ends_the_output_there(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, include: bool) -> None:
    always_draft(monkeypatch)
    steps = spy_steps(monkeypatch)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    async with running(tiny_config(tiny_model_dir, spec_decoding="ngram")) as drafting:
        probe = tokens(await generate(drafting, PROMPT, greedy()))
        probe_steps = [list(item.token_ids) for item in steps]
        assert tokens_of(probe_steps) == probe and any(len(s) > 2 for s in probe_steps), probe_steps
        cases = stop_strings(tokenizer, probe_steps, limit=4)
        assert cases, probe_steps
        drafted = []
        for _, stop in cases:
            steps.clear()
            drafted.append(
                (await generate(drafting, PROMPT, greedy(stop=(stop,), include_stop_str_in_output=include)), sum(len(item.token_ids) for item in steps))
            )
    async with running(tiny_config(tiny_model_dir)) as plain_engine:
        plain = [await generate(plain_engine, PROMPT, greedy(stop=(stop,), include_stop_str_in_output=include)) for _, stop in cases]

    exercised = 0
    for (at, stop), (got, stepped), want in zip(cases, drafted, plain):
        text = "".join(d.text for d in want)
        # Drafting off: the output ends at the token that completes the stop string, the text before it (or through it).
        assert want[-1].finish_reason is FinishReason.STOP and want[-1].stop_reason == stop and len(tokens(want)) == at + 1
        assert text == tokenizer.decode(probe[: at + 1]).removesuffix(stop) + (stop if include else "")
        assert want[-1].usage is not None and want[-1].usage.completion_tokens == at + 1
        # Drafting on: all the same.
        assert "".join(d.text for d in got) == text, stop
        assert tokens(got) == tokens(want), stop
        assert [lp.logprob for d in got for lp in d.logprobs or ()] == pytest.approx([lp.logprob for d in want for lp in d.logprobs or ()], abs=1e-4)
        assert (got[-1].finish_reason, got[-1].stop_reason) == (want[-1].finish_reason, want[-1].stop_reason), stop
        assert got[-1].usage is not None and (got[-1].usage.completion_tokens, len(got[-1].usage.batch_size)) == (at + 1, at + 1), stop
        exercised += stepped > at + 1  # its last step brought tokens past the stop
    assert exercised > 0, cases


def tokens_of(steps: list[list[int]]) -> list[int]:
    return [t for step in steps for t in step]
