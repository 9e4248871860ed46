"""fit_context: the context-length rules shared by the tokenizer actor and beam search."""

from __future__ import annotations

import pytest

from runtime.context_window import fit_context, output_room
from runtime.errors import InvalidRequest


def test_max_tokens_unset_is_the_rest_of_the_context() -> None:
    assert fit_context([1, 2, 3], None, 10) == ([1, 2, 3], 7, 0)


def test_an_empty_prompt_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidRequest) as err:
        fit_context([], 4, 10, param="messages")
    assert err.value.param == "messages"


def test_a_prompt_that_fills_the_context_is_refused() -> None:
    with pytest.raises(InvalidRequest) as err:
        fit_context(list(range(10)), None, 10)
    assert err.value.param == "prompt" and err.value.code == "context_length_exceeded"


def test_too_many_output_tokens_name_the_field_the_client_sent() -> None:
    with pytest.raises(InvalidRequest) as err:
        fit_context([1, 2, 3], 8, 10, max_tokens_param="max_completion_tokens")
    assert err.value.param == "max_completion_tokens" and "asks for 8 more" in str(err.value)


def test_truncate_keeps_the_tail_and_leaves_room_for_the_output() -> None:
    ids, max_tokens, dropped = fit_context(list(range(20)), 4, 10, truncate=True)
    assert ids == list(range(14, 20)) and max_tokens == 4 and dropped == 14
    # max_tokens unset: a quarter of the context (at most 256) is left for the output
    ids, max_tokens, dropped = fit_context(list(range(20)), None, 12, truncate=True)
    assert output_room(None, 12) == 3 and len(ids) == 9 and max_tokens == 3 and dropped == 11
    # a short prompt is left alone
    assert fit_context([1, 2], 4, 10, truncate=True) == ([1, 2], 4, 0)
