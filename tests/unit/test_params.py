"""Request validation: msgspec decoding (the request structs: api.http.openai.chat.request, api.http.openai.completions.request) then cross-field rules (api.http.openai.chat.params, api.http.openai.completions.params).

Every rejection must name the offending field in `InvalidRequest.param`, the OpenAI error's
`param`, whichever stage catches it.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from api.http.openai.chat.params import chat_params
from api.http.openai.chat.request import ChatCompletionRequest
from api.http.openai.completions.params import completion_params, split_prompt
from api.http.openai.completions.request import CompletionRequest
from api.http.shared.body import from_decode_error
from runtime.errors import InvalidRequest
from runtime.sampling import SamplingParams

USER = [{"role": "user", "content": "hi"}]


def _decode(body: dict[str, Any] | bytes, type_: type) -> Any:
    raw = body if isinstance(body, bytes) else msgspec.json.encode(body)
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.DecodeError as exc:
        raise from_decode_error(exc) from exc


def chat(body: dict[str, Any] | bytes):
    return chat_params(_decode(body, ChatCompletionRequest))


def completion(body: dict[str, Any] | bytes):
    return completion_params(_decode(body, CompletionRequest))


def rejected(fn, body) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        fn(body)
    assert info.value.status == 400
    return info.value


# -- decode stage: the JSON path becomes param ----------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": -1}, "max_completion_tokens"),
        ({"n": 0}, "n"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"stop_token_ids": [1, -1]}, "stop_token_ids[1]"),
        ({"seed": 2**64}, "seed"),  # uint64 (MindIE completions) is the widest accepted
        ({"stream": "yes"}, "stream"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ],
)
def test_out_of_range_or_mistyped_field_names_the_field(extra: dict, param: str) -> None:
    err = rejected(chat, {"messages": USER, **extra})
    assert err.param == param
    assert err.code == "invalid_value"


def test_wrong_type_inside_messages_names_the_path() -> None:
    err = rejected(chat, {"messages": [{"role": "user", "content": 5}]})
    assert err.param == "messages[0].content"
    err = rejected(chat, {"messages": USER + [{"role": "robot", "content": "x"}]})
    assert err.param == "messages[1].role"


def test_missing_fields_are_named_with_their_path() -> None:
    assert rejected(chat, {"model": "m"}).param == "messages"
    assert rejected(chat, {"messages": [{"content": "x"}]}).param == "messages[0].role"
    err = rejected(chat, {"messages": [{"role": "user", "content": [{"text": "x"}]}]})
    assert err.param == "messages[0].content[0].type"
    assert rejected(completion, {"max_tokens": 3}).param == "prompt"


def test_empty_messages_rejected() -> None:
    assert rejected(chat, {"messages": []}).param == "messages"


def test_malformed_json_has_no_param() -> None:
    err = rejected(chat, b'{"messages": [')
    assert err.param is None and err.code == "invalid_json"


def test_a_json_string_of_bytes_that_are_not_utf8_is_a_400_not_a_crash() -> None:
    from api.http.shared.body import decode_object

    with pytest.raises(InvalidRequest) as refused:  # the fuzz's body: it was a 500 on the routes that decode any JSON first
        decode_object(b'"\x93"\x80\xd1\xa85\x96\xf0;\x0b!v\xd4\x9c\xf6"')
    assert refused.value.code == "invalid_json"


def test_unknown_fields_are_accepted() -> None:
    _, sampling = chat({"messages": USER, "some_future_sdk_field": {"x": 1}})
    assert isinstance(sampling, SamplingParams)


# -- params stage: cross-field rules ------------------------------------------------------------------


def test_stream_options_without_stream() -> None:
    err = rejected(chat, {"messages": USER, "stream_options": {"include_usage": True}})
    assert err.param == "stream_options"
    chat({"messages": USER, "stream": True, "stream_options": {"include_usage": True}})  # fine with stream
    err = rejected(completion, {"prompt": "x", "stream": False, "stream_options": {}})
    assert err.param == "stream_options"


def test_top_logprobs_without_logprobs() -> None:
    assert rejected(chat, {"messages": USER, "top_logprobs": 2}).param == "top_logprobs"
    assert rejected(chat, {"messages": USER, "top_logprobs": 2, "logprobs": False}).param == "top_logprobs"


def test_image_content_part_is_rejected_naming_the_part() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            },
        ]
    }
    err = rejected(chat, body)
    assert err.param == "messages[1].content[1].type"
    assert "image_url" in str(err)


def test_unknown_content_part_type_is_rejected() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "hologram", "text": "x"}]}]}
    assert rejected(chat, body).param == "messages[0].content[0].type"


def test_text_content_parts_are_joined() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}]}]}
    prompt, _ = chat(body)
    assert prompt.messages == [{"role": "user", "content": "ab"}]


def test_message_without_content_or_tool_calls() -> None:
    assert rejected(chat, {"messages": [{"role": "user"}]}).param == "messages[0].content"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logit_bias": {"42": 1.0}}, "logit_bias"),
        ({"min_tokens": 3}, "min_tokens"),
    ],
)
def test_unsupported_fields_are_rejected_not_ignored(extra: dict, param: str) -> None:
    err = rejected(chat, {"messages": USER, **extra})
    assert err.param == param
    assert err.code == "unsupported_parameter"


def test_n_greater_than_one() -> None:
    # n > 1 is served (siblings forked after the first prefill), but not with greedy sampling,
    # which would return the same answer n times.
    _, sampling = chat({"messages": USER, "n": 3})
    assert sampling.n == 3
    err = rejected(chat, {"messages": USER, "n": 2, "temperature": 0})
    assert err.param == "temperature"
    assert rejected(chat, {"messages": USER, "n": 129}).param == "n"


def test_stop_sequences() -> None:
    assert rejected(chat, {"messages": USER, "stop": ["a", ""]}).param == "stop"
    # MindIE completions: any number of stops, at most 32768 characters in all.
    _, sampling = chat({"messages": USER, "stop": [str(i) for i in range(17)]})
    assert len(sampling.stop) == 17
    assert rejected(chat, {"messages": USER, "stop": ["x" * 20000, "y" * 12769]}).param == "stop"
    _, sampling = chat({"messages": USER, "stop": ["x" * 20000, "y" * 12768]})
    _, sampling = chat({"messages": USER, "stop": "END"})
    assert sampling.stop == ("END",)
    _, sampling = chat({"messages": USER, "stop": ["a", "b"]})
    assert sampling.stop == ("a", "b")


def test_defaults_and_mapping() -> None:
    prompt, sampling = chat({"messages": USER})
    assert prompt.messages == [{"role": "user", "content": "hi"}]
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_tokens) == (1.0, 1.0, 0, None)
    assert sampling.seed is None and sampling.n == 1 and sampling.logprobs is None

    _, sampling = chat(
        {
            "messages": USER,
            "temperature": 0,
            "top_k": -1,
            "top_p": 0.5,
            "max_tokens": 7,
            "max_completion_tokens": 9,
            "seed": -1,
            "stop_token_ids": [3],
            "ignore_eos": True,
            "logprobs": True,
            "top_logprobs": 4,
        }
    )
    assert sampling.temperature == 0.0 and sampling.is_greedy
    assert sampling.top_k == 0  # -1 means off
    assert sampling.max_tokens == 9  # max_completion_tokens wins
    assert 0 <= sampling.seed < 2**63
    assert sampling.stop_token_ids == (3,) and sampling.ignore_eos
    assert sampling.logprobs == 4


# -- completions ----------------------------------------------------------------------------------------


def test_completion_prompt_forms() -> None:
    prompts, sampling = completion({"prompt": "hello", "max_tokens": 5})
    assert [p.text for p in prompts] == ["hello"] and sampling.max_tokens == 5
    prompts, _ = completion({"prompt": [1, 2, 3]})
    assert [p.token_ids for p in prompts] == [[1, 2, 3]]
    prompts, _ = completion({"prompt": [[1, 2], [3]]})
    assert [p.token_ids for p in prompts] == [[1, 2], [3]]


def test_completion_prompt_rejections() -> None:
    assert rejected(completion, {"prompt": []}).param == "prompt"
    assert rejected(completion, {"prompt": [[1, 2], []]}).param == "prompt[1]"
    assert rejected(completion, {"prompt": ["a", 1]}).param == "prompt"
    assert rejected(completion, {"prompt": [-1]}).param is not None


def test_completion_best_of_rules() -> None:
    assert rejected(completion, {"prompt": "x", "n": 3, "best_of": 2}).param == "best_of"
    assert rejected(completion, {"prompt": "x", "best_of": 2, "temperature": 0}).param == "temperature"
    assert rejected(completion, {"prompt": "x", "n": 1, "best_of": 2, "stream": True}).param == "best_of"
    _, sampling = completion({"prompt": "x", "n": 1, "best_of": 3})
    assert sampling.n == 3 and sampling.logprobs == 0  # ranking needs the sampled logprobs


def test_split_prompt_direct() -> None:
    assert split_prompt("a") == ["a"]
    assert split_prompt(["a", "b"]) == ["a", "b"]
    with pytest.raises(InvalidRequest):
        split_prompt([[1], "a"])
