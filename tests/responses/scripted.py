"""A stand-in for `api.streaming.Generation` that "generates" a script, and a grammar check.

Routes build their `Generation` from the module-level name, so a test can swap it in with
monkeypatch and drive the real route, the real SSE framing and the real openai SDK with
exactly the text a model would write — a tool call, say — without any model. It records the
`Prompt` and `SamplingParams` the route built, so tests can also check that the guide the
route asked for accepts the scripted text (`guide_accepts`, compiled with llguidance).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from api.streaming import Collected
from runtime.messages import FinishReason, TextDelta, Usage


class Script:
    def __init__(self, pieces: list[str], finish: FinishReason = FinishReason.STOP) -> None:
        self.pieces = pieces
        self.finish = finish
        self.calls: list[tuple[Any, Any]] = []  # (prompt, sampling) per request

    def __call__(self, runtime: Any, prompts: list[Any], sampling: Any, n: int = 1) -> ScriptedGeneration:
        self.calls.append((prompts[0], sampling))
        return ScriptedGeneration(self, n)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class ScriptedGeneration:
    request_id = "scripted"

    def __init__(self, script: Script, n: int) -> None:
        self.script = script
        self.n = n

    async def start(self) -> ScriptedGeneration:
        return self

    async def deltas(self) -> AsyncIterator[tuple[int, TextDelta]]:
        pieces = self.script.pieces
        for index in range(self.n):
            for i, piece in enumerate(pieces):
                last = i == len(pieces) - 1
                usage = Usage(prompt_tokens=7, completion_tokens=len(pieces)) if last else None
                yield index, TextDelta(text=piece, token_ids=[1], finish_reason=self.script.finish if last else None, usage=usage)

    async def collect(self) -> list[Collected]:
        outs = [Collected() for _ in range(self.n)]
        async for i, delta in self.deltas():
            outs[i].add(delta)
        return outs

    def close(self) -> None:
        pass


_tokenizers: dict[int, Any] = {}


def guide_accepts(tokenizer: Any, guide: Any, text: str) -> bool:
    """Whether llguidance, given `guide` (as the engine would compile it), accepts `text`."""
    import llguidance
    import llguidance.hf

    try:
        from actors.guidance import guide_grammar  # how the engine compiles it
    except ImportError:
        guide_grammar = _grammar

    key = id(tokenizer)
    if key not in _tokenizers:
        _tokenizers[key] = llguidance.hf.from_tokenizer(tokenizer)
    matcher = llguidance.LLMatcher(_tokenizers[key], guide_grammar(guide), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    ids = tokenizer.encode(text, add_special_tokens=False)
    return matcher.consume_tokens(ids) and matcher.is_accepting()


def _grammar(guide: Any) -> str:
    import llguidance

    if guide.kind == "lark":
        return guide.definition
    schema = guide.definition if guide.kind == "json_schema" else '{"type": "object"}'
    return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
