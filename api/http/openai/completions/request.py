"""The POST /v1/completions request body, as a msgspec struct (the Databricks Foundation Model
API's completions request, and MindIE Server's completions with beam search, best_of, echo and
legacy logprobs).

Owns: the fields only Completions has; the ones it shares with Chat are common/fields.py
`SamplingFields`. Cross-field rules are completions/params.py's. Imports msgspec and
api.http.openai.common.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from api.http.openai.common.fields import SamplingFields, TokenId


class CompletionRequest(SamplingFields, kw_only=True):
    # A string, a list of strings, a list of token ids, or a list of token-id lists. msgspec
    # allows one array type per union, so list items are a union checked in params.py.
    prompt: str | list[str | TokenId | list[TokenId]]
    echo: bool = False
    suffix: str | None = None
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    best_of: Annotated[int, Meta(ge=1, le=128)] | None = None
    use_beam_search: bool = False
    use_raw_prompt: bool = False
    error_behavior: Literal["truncate", "error"] = "error"
