"""IncrementalDetokenizer: no half characters, no leaked stop strings, nothing lost at the end."""

from __future__ import annotations

import random

import pytest

from actors.detok_core import IncrementalDetokenizer
from tests.support.tiny_tokenizer import EOS, build_tiny_tokenizer, byte_token_ids

TEXTS = [
    "hello world",
    "café au lait",
    "😀😀😀",
    "naïve 日本語 text",
    "a😀b é c",
    "hello STOP world",
]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def _groups(ids: list[int], sizes: list[int]) -> list[list[int]]:
    out, i, k = [], 0, 0
    while i < len(ids):
        n = sizes[k % len(sizes)]
        out.append(ids[i : i + n])
        i += n
        k += 1
    return out


def _run(tok, groups: list[list[int]], **kwargs) -> tuple[list[str], str | None, IncrementalDetokenizer]:
    """Push groups until a stop string hits; flush otherwise. Returns the chunks emitted."""
    d = IncrementalDetokenizer(tok, **kwargs)
    chunks: list[str] = []
    for group in groups:
        out, stop = d.push(group)
        chunks.append(out)
        if stop is not None:
            return chunks, stop, d
    chunks.append(d.flush())
    return chunks, None, d


def _encodings(tok, text: str) -> dict[str, list[int]]:
    return {"bpe": tok.encode(text).ids, "bytes": byte_token_ids(text)}


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("sizes", [[1], [2], [3, 1], [100]])
def test_no_half_characters_and_text_equals_decode(tok, text: str, sizes: list[int]) -> None:
    for kind, ids in _encodings(tok, text).items():
        chunks, stop, d = _run(tok, _groups(ids, sizes))
        assert stop is None
        for chunk in chunks:
            assert "\ufffd" not in chunk, (kind, chunks)
        assert "".join(chunks) == text == tok.decode(ids), (kind, chunks)
        assert d.text == text


def test_bytes_of_one_character_emit_nothing_until_complete(tok) -> None:
    ids = byte_token_ids("😀")
    assert len(ids) == 4
    d = IncrementalDetokenizer(tok)
    assert [d.push([i])[0] for i in ids] == ["", "", "", "😀"]


def test_token_spanning_two_characters(tok) -> None:
    # The tiny tokenizer has a token holding the last byte of one 😀 and the first of the next.
    ids = tok.encode("😀😀").ids
    assert len(ids) == 7
    d = IncrementalDetokenizer(tok)
    outs = [d.push([i])[0] for i in ids]
    assert "".join(outs) == "😀😀"
    # DecodeStream holds a piece that ends in a partial character whole, so the first 😀 waits
    # for the second; what matters is that no chunk ever carries half of either.
    assert all("\ufffd" not in o for o in outs)
    assert outs[:3] == ["", "", ""]


def test_emitted_text_is_always_a_prefix_of_the_final_text(tok) -> None:
    text = "naïve 😀 日本語 hello"
    data = text.encode("utf-8")
    d = IncrementalDetokenizer(tok, stop=("zzzz",))
    for k, i in enumerate(byte_token_ids(text)):
        d.push([i])
        complete = data[: k + 1].decode("utf-8", errors="ignore")  # whole characters so far
        # Everything decoded except the last len("zzzz") - 1 characters.
        assert d.text == complete[: max(0, len(complete) - 3)]
    assert d.flush() == text[-3:]
    assert d.text == text


def test_holds_back_exactly_longest_stop_minus_one(tok) -> None:
    d = IncrementalDetokenizer(tok, stop=("xyz", "q"))
    out, stop = d.push(tok.encode("hello").ids)
    assert (out, stop) == ("hel", None)
    assert d.flush() == "lo"
    assert d.text == "hello"
    assert d.flush() == ""


def test_no_stop_means_no_hold_back(tok) -> None:
    d = IncrementalDetokenizer(tok)
    assert d.push(tok.encode("hello").ids) == ("hello", None)
    assert d.flush() == ""


@pytest.mark.parametrize(
    ("text", "stop"),
    [
        ("hello STOP world", "STOP"),  # one token
        ("hello STOP world", "OP wo"),  # across tokens
        ("hello world", "lo w"),
        ("hello world", "d"),  # the very last character
        ("hello world", "h"),  # the very first character
        ("café au lait", "é a"),  # starts inside a multi-byte character
        ("a😀b é c", "😀b"),
        ("😀😀😀", "😀😀"),
    ],
)
@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("sizes", [[1], [2], [3, 1], [100]])
def test_stop_string_never_leaks(tok, text: str, stop: str, include: bool, sizes: list[int]) -> None:
    index = text.index(stop)
    expected = text[: index + (len(stop) if include else 0)]
    for kind, ids in _encodings(tok, text).items():
        chunks, hit, d = _run(tok, _groups(ids, sizes), stop=(stop,), include_stop_str_in_output=include)
        assert hit == stop, (kind, chunks)
        assert "".join(chunks) == expected == d.text, (kind, chunks)
        for chunk in chunks:
            assert "\ufffd" not in chunk
        if not include:
            assert stop not in "".join(chunks)
            # Not even a partial stop string at the end of what was emitted before the hit.
            before_hit = "".join(chunks[:-1])
            assert text.startswith(before_hit) and len(before_hit) <= index


def test_earliest_stop_wins_and_empty_stops_are_ignored(tok) -> None:
    d = IncrementalDetokenizer(tok, stop=("", "world", "lo"))
    out, stop = d.push(tok.encode("hello world").ids)
    assert (out, stop) == ("hel", "lo")


def test_stop_found_in_text_held_back_from_earlier_pushes(tok) -> None:
    d = IncrementalDetokenizer(tok, stop=("STOP",))
    emitted = ""
    for piece in ["ab", "cS", "T", "O", "Pxyz"]:
        out, stop = d.push(tok.encode(piece).ids)
        emitted += out
        assert "S" not in emitted
    assert stop == "STOP"
    assert emitted == "abc"


def test_fuzz_single_stop_against_reference(tok) -> None:
    rng = random.Random(1234)
    alphabet = ["a", "b", " ", "é", "😀", "日", "S", "T"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14)))
        if rng.random() < 0.7:
            i = rng.randrange(len(text))
            stop = text[i : i + rng.randint(1, 4)]
        else:
            stop = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3)))
        include = rng.random() < 0.5
        ids = byte_token_ids(text) if rng.random() < 0.5 else tok.encode(text).ids
        sizes = [rng.randint(1, 4) for _ in range(3)]
        chunks, hit, d = _run(tok, _groups(ids, sizes), stop=(stop,), include_stop_str_in_output=include)
        index = text.find(stop)
        if index == -1:
            assert hit is None and "".join(chunks) == text
        else:
            assert hit == stop
            assert "".join(chunks) == text[: index + (len(stop) if include else 0)], (text, stop, sizes)
        assert all("\ufffd" not in c for c in chunks), (text, stop, chunks)


def test_special_tokens_skipped_or_kept(tok) -> None:
    ids = tok.encode("hello").ids + [tok.token_to_id(EOS)]
    chunks, _, _ = _run(tok, [[i] for i in ids])
    assert "".join(chunks) == "hello"
    chunks, _, _ = _run(tok, [[i] for i in ids], skip_special_tokens=False)
    assert "".join(chunks) == "hello" + EOS


@pytest.mark.parametrize("stop", [(), ("zzz",)])
def test_flush_after_a_cut_mid_character_matches_a_full_decode(tok, stop: tuple[str, ...]) -> None:
    # max_tokens can end a request inside a multi-byte character: nothing half is streamed
    # before the end, and at the end the text is what a full decode renders.
    ids = byte_token_ids("ab😀")[:-2]  # a, b, and the first 2 of the emoji's 4 bytes
    d = IncrementalDetokenizer(tok, stop=stop)
    chunks = [d.push([i])[0] for i in ids]
    assert all("\ufffd" not in c for c in chunks)
    assert "".join(chunks) == "ab"[: len("ab") - (len(stop[0]) - 1 if stop else 0)]
    chunks.append(d.flush())
    assert "".join(chunks) == d.text == tok.decode(ids)
    assert d.text.startswith("ab") and d.text != "ab"


def _taken(tok, ids: list[int], sizes: list[int], **kwargs) -> tuple[str, str | None, int]:
    """Text, stop hit and tokens the output keeps, pushing `ids` in groups of `sizes`."""
    d = IncrementalDetokenizer(tok, **kwargs)
    text, taken = "", 0
    for group in _groups(ids, sizes):
        out, stop = d.push(group)
        text += out
        taken += d.num_taken
        if stop is not None:
            return text, stop, taken
    return text + d.flush(), None, taken


def test_several_tokens_at_once_stop_where_one_at_a_time_would(tok) -> None:
    """A speculative step hands over a kept draft and the token after it together: the stop
    string one of them completes ends the output at that token (`num_taken`), and a stop that
    starts earlier but completes later loses, as it does one token a step."""
    ids = tok.encode("hello STOP world").ids
    one = _taken(tok, ids, [1], stop=("STOP",))
    assert one[:2] == ("hello ", "STOP") and one[2] < len(ids)
    assert _taken(tok, ids, [100], stop=("STOP",)) == one
    ids = byte_token_ids("xabcx")
    assert _taken(tok, ids, [1], stop=("abc", "b")) == ("xa", "b", 3)
    assert _taken(tok, ids, [100], stop=("abc", "b")) == ("xa", "b", 3)
    rng = random.Random(24)
    alphabet = ["a", "b", " ", "é", "😀", "S", "T"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14)))
        stops = tuple("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 2)))
        include = rng.random() < 0.5
        ids = byte_token_ids(text) if rng.random() < 0.5 else tok.encode(text).ids
        sizes = [rng.randint(1, 5) for _ in range(3)]
        options = dict(stop=stops, include_stop_str_in_output=include)
        assert _taken(tok, ids, sizes, **options) == _taken(tok, ids, [1], **options), (text, stops, sizes)
