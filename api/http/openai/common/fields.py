"""Request fields Chat and Completions share, as msgspec types: `SamplingFields` and the ranges
its fields decode with.

Owns: field names, types, defaults and single-field ranges (`Meta`), per the public references
the project implements: the Databricks Foundation Model API (Chat, Completions), Azure ML chat
completions and MindIE Server completions. Decoding a body is the first half of validation;
common/sampling.py and each endpoint's params.py are the second (cross-field rules, model
limits). Unknown fields are accepted, since SDKs add fields over time; known fields we cannot
honour are rejected in common/sampling.py, naming the field. Imports msgspec only.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
# -1 (MindIE completions) or null means off; otherwise > 0. 0 is rejected in
# common/sampling.py, naming top_k (msgspec bounds one interval only).
TopK = Annotated[int, Meta(ge=-1)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
RepetitionPenalty = Annotated[float, Meta(gt=0.0, le=2.0)]
PositiveInt = Annotated[int, Meta(ge=1)]
# A `seed` is a uint64 in MindIE completions and an int64 in OpenAI's API; msgspec decodes both
# ranges but cannot bound past int64, so common/sampling.py and completions/params.py check it.
Seed = int
TokenId = Annotated[int, Meta(ge=0)]


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(msgspec.Struct, kw_only=True):
    """Fields Chat and Completions share, with the references' defaults."""

    model: str | None = None
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    n: Annotated[int, Meta(ge=1, le=128)] = 1
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM / MindIE extensions that clients of those servers send.
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    min_tokens: Annotated[int, Meta(ge=0)] = 0
