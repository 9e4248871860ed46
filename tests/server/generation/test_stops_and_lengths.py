"""Where generation ends and what the text holds: stop, stop_token_ids, include_stop_str_in_output,
ignore_eos, skip_special_tokens, echo, suffix (the Databricks Completions request, MindIE
completions).

Every expectation is derived from the transformers reference's greedy continuation of the same
prompt, so a test says "the k-th greedy token was X, so with stop_token_ids=[X] exactly k
tokens come back", not merely that a field is present.
"""

from __future__ import annotations

import httpx

from tests.support.http import complete, stream_events
from tests.support.reference import Reference
from tests.support.servers import Server
from tests.support.waiting import in_thread

HELLO = "hello there"
# Token-id prompts on which the tiny model greedily emits a special token (checked below).
EOS_PROMPT = [102, 312, 179, 231, 181, 189]  # greedy EOS (<|im_end|>) after 15 tokens
BOS_PROMPT = [271, 256, 178, 232, 150, 314]  # greedy <|im_start|> after 13 tokens


def _first_new(tokens: list[int], start: int, avoid: set[int]) -> int:
    """Index of the first token at or after `start` that did not occur before it."""
    for k in range(start, len(tokens)):
        if tokens[k] not in tokens[:k] and tokens[k] not in avoid:
            return k
    raise AssertionError(f"no fresh token in {tokens}")


async def test_stop_token_ids_end_generation_and_are_the_stop_reason(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    prompt = ref.encode(HELLO)
    greedy = await in_thread(ref.greedy, prompt, 16)
    k = _first_new(greedy, 3, {ref.eos})  # 0-based: stop token is the (k+1)-th generated
    stop_id = greedy[k]
    body = dict(prompt=HELLO, max_tokens=16, temperature=0, ignore_eos=True, stop_token_ids=[stop_id])

    out = await complete(http, **body)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop_id
    assert out["usage"]["completion_tokens"] == k + 1
    assert choice["text"] == ref.decode(greedy[:k])  # the stop token itself is not in the text

    kept = await complete(http, **body, include_stop_str_in_output=True)
    assert kept["choices"][0]["stop_reason"] == stop_id
    assert kept["usage"]["completion_tokens"] == k + 1
    assert kept["choices"][0]["text"] == ref.decode(greedy[: k + 1])

    # Streaming ends at the same place and reports the same reason.
    events = await stream_events(http, "/v1/completions", **body)
    assert "".join(e["choices"][0]["text"] for e in events) == choice["text"]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"][0]["stop_reason"] == stop_id


async def test_stop_strings_are_cut_from_the_text(server: Server, http: httpx.AsyncClient) -> None:
    base = (await complete(http, prompt="Paged", max_tokens=24, temperature=0, ignore_eos=True))["choices"][0]["text"]
    at = _ascii_stop_at(base)
    stop = base[at : at + 2]
    body = dict(prompt="Paged", max_tokens=24, temperature=0, ignore_eos=True, stop=["never-there", stop])

    cut = (await complete(http, **body))["choices"][0]
    assert cut["text"] == base[:at]
    assert cut["finish_reason"] == "stop"
    assert cut["stop_reason"] == stop

    kept = (await complete(http, **body, include_stop_str_in_output=True))["choices"][0]
    assert kept["text"] == base[: at + 2]
    assert kept["stop_reason"] == stop

    events = await stream_events(http, "/v1/completions", **body)
    assert "".join(e["choices"][0]["text"] for e in events) == base[:at]
    assert events[-1]["choices"][0]["stop_reason"] == stop

    # Chat honours stop strings the same way.
    chat_body = {"model": "tiny", "messages": [{"role": "user", "content": "Paged"}], "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    chat_text = (await http.post("/v1/chat/completions", json=chat_body)).json()["choices"][0]["message"]["content"]
    at = _ascii_stop_at(chat_text)
    r = await http.post("/v1/chat/completions", json={**chat_body, "stop": chat_text[at : at + 2]})
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == chat_text[:at]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == chat_text[at : at + 2]


def _ascii_stop_at(text: str) -> int:
    """Where a two-character alphanumeric ASCII string first occurs in `text`, not at its start."""
    for i in range(1, len(text) - 1):
        piece = text[i : i + 2]
        if piece.isascii() and piece.isalnum() and text.find(piece) == i:
            return i
    raise AssertionError(f"precondition: no ASCII stop string candidate in {text!r}")


async def test_eos_ends_generation_unless_ignore_eos(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    greedy = await in_thread(ref.greedy, EOS_PROMPT, 20)
    assert ref.eos in greedy, f"precondition: the tiny model no longer emits EOS after {EOS_PROMPT}: {greedy}"
    k = greedy.index(ref.eos)

    stopped = await complete(http, prompt=EOS_PROMPT, max_tokens=20, temperature=0)
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] is None  # EOS is not an explicit stop
    assert stopped["usage"]["completion_tokens"] == k + 1
    assert choice["text"] == ref.decode(greedy[:k])

    ignored = await complete(http, prompt=EOS_PROMPT, max_tokens=20, temperature=0, ignore_eos=True)
    choice = ignored["choices"][0]
    assert choice["finish_reason"] == "length"
    assert ignored["usage"]["completion_tokens"] == 20
    assert choice["text"] == ref.decode(greedy)  # EOS is special: skipped from the text

    raw = await complete(http, prompt=EOS_PROMPT, max_tokens=20, temperature=0, ignore_eos=True, skip_special_tokens=False)
    assert raw["choices"][0]["text"] == ref.decode(greedy, skip_special_tokens=False)
    assert ref.tokenizer.eos_token in raw["choices"][0]["text"]


async def test_skip_special_tokens(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    greedy = await in_thread(ref.greedy, BOS_PROMPT, 16)
    special = ref.tokenizer.bos_token
    assert ref.tokenizer.bos_token_id in greedy, f"precondition: no <|im_start|> after {BOS_PROMPT}: {greedy}"
    body = dict(prompt=BOS_PROMPT, max_tokens=16, temperature=0, ignore_eos=True)

    skipped = (await complete(http, **body))["choices"][0]["text"]
    kept = (await complete(http, **body, skip_special_tokens=False))["choices"][0]["text"]
    assert special not in skipped and special in kept
    assert kept == ref.decode(greedy, skip_special_tokens=False)
    assert skipped == ref.decode(greedy)


async def test_echo_returns_the_prompt_and_suffix_is_appended(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    prompt = "The quick brown"
    base = dict(max_tokens=8, temperature=0, ignore_eos=True)
    plain = (await complete(http, prompt=prompt, **base))["choices"][0]["text"]
    greedy = await in_thread(ref.greedy, ref.encode(prompt), 8)
    assert plain == ref.decode(greedy)

    echoed = (await complete(http, prompt=prompt, echo=True, **base))["choices"][0]["text"]
    assert echoed == prompt + plain

    suffixed = (await complete(http, prompt=prompt, suffix=" [END]", **base))["choices"][0]["text"]
    assert suffixed == plain + " [END]"

    both = (await complete(http, prompt=prompt, echo=True, suffix="!", **base))["choices"][0]["text"]
    assert both == prompt + plain + "!"

    # A token-id prompt echoes as its decoded text.
    ids = ref.encode(prompt)
    echoed_ids = (await complete(http, prompt=ids, echo=True, **base))["choices"][0]["text"]
    assert echoed_ids == ref.decode(ids) + plain

    # Streaming: echo first, suffix last, same text overall.
    events = await stream_events(http, "/v1/completions", prompt=prompt, echo=True, suffix=" [END]", **base)
    texts = [e["choices"][0]["text"] for e in events]
    assert texts[0].startswith(prompt)
    assert texts[-1].endswith(" [END]")
    assert "".join(texts) == prompt + plain + " [END]"

    # A suffix is appended after a stop too, and is not itself subject to stop strings.
    stop_id = greedy[3]
    stopped = (await complete(http, prompt=prompt, suffix="END", stop_token_ids=[stop_id], stop=["END"], **base))["choices"][0]
    assert stopped["text"] == ref.decode(greedy[: greedy.index(stop_id)]) + "END"


async def test_text_is_the_decode_of_its_tokens(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    """A generation that ends inside a multi-byte character still returns all its tokens' text.

    "hello there" greedily continues [101, 277, 100, ...]; token 100 is the lead byte of a
    UTF-8 sequence that never completes. With max_tokens=3 the three tokens decode (as
    transformers, OpenAI and vLLM's final output do) to "\ufffdnd\ufffd": the last token's byte
    becomes U+FFFD rather than vanishing while completion_tokens still counts it.
    """
    prompt = ref.encode(HELLO)
    greedy = await in_thread(ref.greedy, prompt, 8)
    cut = next(m for m in range(2, 9) if ref.decode(greedy[:m]).endswith("\ufffd") and not ref.decode(greedy[: m - 1]).endswith("\ufffd"))
    out = await complete(http, prompt=prompt, max_tokens=cut, temperature=0, ignore_eos=True)
    assert out["usage"]["completion_tokens"] == cut
    assert out["choices"][0]["text"] == ref.decode(greedy[:cut])
