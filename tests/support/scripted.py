"""A stand-in for `api.http.openai.common.generation.Generation` that "generates" a script, and a grammar check.

Routes build their `Generation` from the module-level name, so a test can swap it in with
monkeypatch and drive the real route, the real SSE framing and the real openai SDK with
exactly the text a model would write — a tool call, say — without any model. It records the
`Prompt` and `SamplingParams` the route built, so tests can also check that the guide the
route asked for accepts the scripted text (`guide_accepts`, compiled with llguidance).

A script is the whole assistant turn. When the guide has a `prefix` (a forced call's opening,
which the prompt ends with), the scripted model, like a real one, generates only what follows
it: a script that does not start with the prefix fails the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from api.http.openai.common.generation import Collected
from runtime.errors import RequestFailed
from runtime.messages import FinishReason, Logprob, TextDelta, Usage


class Script:
    """`pieces`: the text of each delta. With `logprobs`, piece i comes with one token whose
    logprob is -i (so a test can tell which pieces' tokens ended up where). With `fail_at`,
    the engine fails the request before piece `fail_at` (0: before the first token)."""

    def __init__(self, pieces: list[str], finish: FinishReason = FinishReason.STOP, logprobs: bool = False, fail_at: int | None = None) -> None:
        self.pieces = pieces
        self.finish = finish
        self.logprobs = logprobs
        self.fail_at = fail_at
        self.calls: list[tuple[Any, Any]] = []  # (prompt, sampling) per request

    def __call__(self, runtime: Any, prompts: list[Any], sampling: Any, n: int = 1) -> ScriptedGeneration:
        self.calls.append((prompts[0], sampling))
        return ScriptedGeneration(self, n, _after(sampling.guide, self.pieces))

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class ScriptedGeneration:
    request_id = "scripted"

    def __init__(self, script: Script, n: int, pieces: list[str]) -> None:
        self.script = script
        self.n = n
        self.pieces = pieces  # what the model generates: the script after the guide's prefix

    async def start(self) -> ScriptedGeneration:
        if self.script.fail_at == 0:
            raise RequestFailed("grammar error: scripted failure before the first token")
        return self

    async def deltas(self) -> AsyncIterator[tuple[int, TextDelta]]:
        pieces = self.pieces
        for index in range(self.n):
            for i, piece in enumerate(pieces):
                if i == self.script.fail_at:
                    raise RequestFailed("grammar error: scripted failure")
                last = i == len(pieces) - 1
                usage = Usage(prompt_tokens=7, completion_tokens=len(pieces)) if last else None
                logprobs = [Logprob(token_id=10 + i % 200, logprob=-float(i), top=[(11, -0.5)])] if self.script.logprobs else None
                yield index, TextDelta(text=piece, token_ids=[1], logprobs=logprobs, finish_reason=self.script.finish if last else None, usage=usage)

    async def collect(self) -> list[Collected]:
        outs = [Collected() for _ in range(self.n)]
        async for i, delta in self.deltas():
            outs[i].add(delta)
        return outs

    def close(self) -> None:
        pass


def _after(guide: Any, pieces: list[str]) -> list[str]:
    """The script's pieces after the guide's prefix (empty pieces dropped)."""
    prefix = guide.prefix if guide is not None else ""
    text = "".join(pieces)
    assert text.startswith(prefix), f"the script {text!r} does not start with the prompt's end {prefix!r}"
    out, skip = [], len(prefix)
    for piece in pieces:
        cut = min(skip, len(piece))
        skip -= cut
        if piece[cut:]:
            out.append(piece[cut:])
    return out


_tokenizers: dict[int, Any] = {}


def guide_accepts(tokenizer: Any, guide: Any, text: str) -> bool:
    """Whether llguidance, given `guide` (as the engine would compile it), accepts `text`: the
    whole turn, whose start the guide's `prefix` (the prompt's end) must be."""
    import llguidance
    import llguidance.hf

    from actors.guidance import guide_grammar  # how the engine compiles it

    key = id(tokenizer)
    if key not in _tokenizers:
        _tokenizers[key] = llguidance.hf.from_tokenizer(tokenizer)
    matcher = llguidance.LLMatcher(_tokenizers[key], guide_grammar(guide), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    if not text.startswith(guide.prefix):
        return False
    ids = tokenizer.encode(text[len(guide.prefix) :], add_special_tokens=False)
    return matcher.consume_tokens(ids) and matcher.is_accepting()

