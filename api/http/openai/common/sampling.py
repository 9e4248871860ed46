"""The rules every generating endpoint shares, and the `SamplingParams` Chat and Completions
build from `SamplingFields`.

Owns: defaults, the cross-field rules Chat, Completions and beam search share (stream_options
needs stream, n > 1 needs a temperature, ...), the stop-sequence limits, and the fields we accept
in the schema but cannot honour yet, each rejected with a 400 naming it rather than silently
ignored. Each endpoint's params.py adds its own rules on top. Imports api.http.openai.common and
runtime.
"""

from __future__ import annotations

from api.http.openai.common.fields import SamplingFields
from runtime.errors import InvalidRequest
from runtime.generation_defaults import SamplingDefaults
from runtime.sampling import SamplingParams

NONE = SamplingDefaults()

# MindIE completions: a stop string has 1 to 32768 characters; a list's strings are non-empty and
# hold at most 32768 characters together (an empty list is null). No reference limits how many
# there are.
STOP_MAX_CHARS = 32 * 1024


def unsupported(param: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"{what} is not supported by this server yet.", param=param, code="unsupported_parameter")


def check_stream_options(stream: bool, stream_options: object) -> None:
    """stream_options only with stream: the rule of every endpoint that streams."""
    if stream_options is not None and not stream:
        raise InvalidRequest("stream_options is only allowed when stream is true.", param="stream_options")


def sampling_params(
    req: SamplingFields, max_tokens: int | None, *, n_generate: int, logprobs: int | None, beam: bool = False, defaults: SamplingDefaults = NONE
) -> SamplingParams:
    """Every rule Chat, Completions and beam search share; `beam`: deterministic beam search,
    where n > 1 needs no temperature; `defaults`: the model's, for fields the request omits."""
    check_stream_options(req.stream, req.stream_options)
    if not beam and req.n > 1 and req.temperature == 0.0:
        raise InvalidRequest("n > 1 needs temperature > 0 (greedy sampling would repeat one answer n times).", param="temperature")
    if req.top_k == 0:
        # The Databricks reference: null or an integer > 0; MindIE's: -1 or (0, 2147483647].
        # 0 is neither.
        raise InvalidRequest("top_k must be -1 or null (off), or greater than 0.", param="top_k")
    if req.logit_bias:
        raise unsupported("logit_bias", "logit_bias")
    if req.min_tokens:
        raise unsupported("min_tokens", "min_tokens")
    if req.seed is not None and not -(2**63) <= req.seed <= 2**64 - 1:
        raise InvalidRequest("seed must fit in 64 bits.", param="seed", code="invalid_value")
    top_k = req.top_k if req.top_k is not None else defaults.top_k or 0
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=default(req.temperature, defaults.temperature, 1.0),
        top_p=default(req.top_p, defaults.top_p, 1.0),
        top_k=0 if top_k == -1 else top_k,
        seed=None if req.seed is None else req.seed % (1 << 63),
        stop=_stop_tuple(req.stop),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=req.ignore_eos,
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=default(req.repetition_penalty, defaults.repetition_penalty, 1.0),
        logprobs=logprobs,
        n=n_generate,
    )


def default(given: float | None, model: float | None, api: float) -> float:
    """A sampling field: the request's, else the model's default, else the API's."""
    return given if given is not None else model if model is not None else api


def _stop_tuple(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if any(s == "" for s in stops):
        raise InvalidRequest("Stop sequences must not be empty.", param="stop")
    if sum(len(s) for s in stops) > STOP_MAX_CHARS:
        raise InvalidRequest(f"Stop sequences may hold at most {STOP_MAX_CHARS} characters in all.", param="stop")
    return stops
