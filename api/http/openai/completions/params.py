"""The one place a decoded completions request becomes the engine's `Prompt`s and
`SamplingParams`: best_of, echo with logprobs, the prompt's shapes, and beam search's rules.

The rules Completions shares with Chat are common/sampling.py's. Imports
api.http.openai.common, api.http.openai.completions and runtime.
"""

from __future__ import annotations

from typing import Any

import msgspec

from api.http.openai.common.sampling import NONE, sampling_params
from api.http.openai.completions.request import CompletionRequest
from runtime.errors import InvalidRequest
from runtime.generation_defaults import SamplingDefaults
from runtime.request import Prompt
from runtime.sampling import SamplingParams

# MindIE completions: a completion's seed is a uint64 in (0, 18446744073709551615]; Chat's is
# OpenAI's int64 (Azure ML's chat completions set no range), checked in common/sampling.py.
SEED_MAX = 2**64 - 1


def completion_params(req: CompletionRequest, defaults: SamplingDefaults = NONE) -> tuple[list[Prompt], SamplingParams]:
    """Prompts (one per prompt in a batch) and the parameters each of their sequences uses
    (`defaults`: the model's, for the sampling fields the request omits).

    `sampling.n` is how many sequences run per prompt: best_of when given (the route returns
    the n best by cumulative logprob), else n. use_beam_search goes to `_beam_params`.
    """
    if req.seed is not None and not 0 < req.seed <= SEED_MAX:
        raise InvalidRequest(f"seed must be in (0, {SEED_MAX}] (MindIE completions); got {req.seed}.", param="seed", code="invalid_value")
    if req.use_beam_search:
        return _beam_params(req)
    best_of = req.best_of if req.best_of is not None else req.n
    if best_of < req.n:
        raise InvalidRequest(f"best_of ({best_of}) must be at least n ({req.n}).", param="best_of")
    if req.stream and best_of != req.n:
        raise InvalidRequest("Streaming needs best_of equal to n: the best sequences are only known at the end.", param="best_of")
    if best_of > 1 and req.temperature == 0.0:
        raise InvalidRequest("best_of > 1 needs temperature > 0.", param="temperature")
    # Ranking by cumulative logprob needs the sampled tokens' logprobs even when the client did
    # not ask for them; the route strips what it was not asked for.
    logprobs = req.logprobs if req.logprobs is not None else (0 if best_of > req.n else None)
    sampling = sampling_params(req, req.max_tokens, n_generate=best_of, logprobs=logprobs, defaults=defaults)
    if req.echo and req.logprobs is not None:
        sampling = msgspec.structs.replace(sampling, prompt_logprobs=req.logprobs)
    return _prompts(req), sampling


def _beam_params(req: CompletionRequest) -> tuple[list[Prompt], SamplingParams]:
    """Beam search (MindIE completions): width = max(best_of, n), returns n, ranked by score.

    The shared rules apply (`sampling_params`), and every control is honoured by
    completions/beam.py (stop_token_ids, ignore_eos, the penalties, logprobs, echo, suffix,
    error_behavior) except these, rejected naming the field: `stop`, which MindIE's reference
    says beam search does not take; top_p / top_k other than off, which restrict sampling and a
    deterministic search does not sample. temperature and seed are accepted (MindIE's own beam
    example sends temperature 1) and have nothing to act on, as in transformers'
    generate(num_beams=k, do_sample=False). best_of is not checked against n here, as MindIE's
    reference says. `sampling.n` carries the width.
    """
    if req.stop:
        raise InvalidRequest("use_beam_search cannot be combined with stop (MindIE completions).", param="stop")
    if req.top_p is not None and req.top_p != 1.0:
        raise InvalidRequest("top_p does not apply to beam search, which does not sample.", param="top_p")
    if req.top_k is not None and req.top_k > 0:
        raise InvalidRequest("top_k does not apply to beam search, which does not sample.", param="top_k")
    width = max(req.n, req.best_of or 1)
    sampling = sampling_params(req, req.max_tokens, n_generate=width, logprobs=req.logprobs, beam=True)
    sampling = msgspec.structs.replace(sampling, temperature=0.0, top_p=1.0, top_k=0, seed=None)
    if req.echo and req.logprobs is not None:
        sampling = msgspec.structs.replace(sampling, prompt_logprobs=req.logprobs)
    return _prompts(req), sampling


def _prompts(req: CompletionRequest) -> list[Prompt]:
    truncate = req.error_behavior == "truncate"
    return [
        Prompt(text=p, add_special_tokens=not req.use_raw_prompt, truncate=truncate)
        if isinstance(p, str)
        else Prompt(token_ids=p, truncate=truncate)
        for p in split_prompt(req.prompt)
    ]


def split_prompt(prompt: str | list[Any]) -> list[str | list[int]]:
    """A Completions `prompt` as a list of prompts, each text or token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise InvalidRequest("The prompt is empty.", param="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, list) for p in prompt):
        for i, ids in enumerate(prompt):
            if not ids:
                raise InvalidRequest("A token-id prompt is empty.", param=f"prompt[{i}]")
        return [list(p) for p in prompt]
    raise InvalidRequest("prompt must be a string, a list of strings, a list of token ids or a list of such lists.", param="prompt")
