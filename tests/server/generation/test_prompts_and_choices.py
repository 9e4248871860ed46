"""use_raw_prompt (the Databricks Completions request), and how choices of a prompt list are numbered and offset.

use_raw_prompt: "pass the prompt to the model without any transformation", i.e. without the
special tokens the tokenizer adds. The shared tiny tokenizer adds none, so these tests serve a
copy of the tiny model whose tokenizer prepends BOS (<|im_start|>), and check the model saw
(and usage counts) the BOS only when use_raw_prompt is false.

Choice `index` is prompt_index * n + i and each choice's `text_offset` counts from the start
of its own text (api/http/openai/completions/view.py explains both decisions against the references).
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from tests.support.http import complete, stream_events
from tests.support.reference import Reference
from tests.support.servers import Server, start_server, tiny_config
from tests.support.waiting import in_thread

TEXT = "The quick brown"


def _with_bos(src: Path, dst: Path) -> Path:
    from tokenizers import Tokenizer, processors

    shutil.copytree(src, dst)
    tok = Tokenizer.from_file(str(dst / "tokenizer.json"))
    bos = tok.token_to_id("<|im_start|>")
    tok.post_processor = processors.TemplateProcessing(single="<|im_start|> $A", pair="<|im_start|> $A $B", special_tokens=[("<|im_start|>", bos)])
    tok.save(str(dst / "tokenizer.json"))
    return dst


@pytest.fixture
async def bos_server(tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[tuple[Server, int]]:
    from transformers import AutoTokenizer

    model_dir = _with_bos(tiny_model_dir, tmp_path / "tiny-bos")
    bos = AutoTokenizer.from_pretrained(model_dir).convert_tokens_to_ids("<|im_start|>")
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, tiny_config(model_dir))
        yield srv, bos
        srv.stop.set()


async def test_use_raw_prompt_skips_the_tokenizers_special_tokens(bos_server: tuple[Server, int], ref: Reference) -> None:
    server, bos = bos_server
    raw = ref.encode(TEXT)  # the shared tokenizer adds nothing: these are the text's own tokens
    with_bos = [bos, *raw]
    greedy_bos = await in_thread(ref.greedy, with_bos, 6)  # same weights as the served copy
    greedy_raw = await in_thread(ref.greedy, raw, 6)
    assert greedy_bos != greedy_raw
    body = {"prompt": TEXT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        default = await complete(http, **body, echo=True, logprobs=0)
        assert default["usage"]["prompt_tokens"] == len(with_bos)
        assert default["choices"][0]["text"] == TEXT + ref.decode(greedy_bos)
        assert default["choices"][0]["logprobs"]["tokens"][0] == ref.token_text(bos)

        rawed = await complete(http, **body, echo=True, logprobs=0, use_raw_prompt=True)
        assert rawed["usage"]["prompt_tokens"] == len(raw)
        assert rawed["choices"][0]["text"] == TEXT + ref.decode(greedy_raw)
        assert rawed["choices"][0]["logprobs"]["tokens"][: len(raw)] == [ref.token_text(t) for t in raw]

        # Streaming and beam search read the prompt the same way.
        events = await stream_events(http, "/v1/completions", **body, use_raw_prompt=True)
        assert "".join(c["text"] for e in events for c in e["choices"]) == ref.decode(greedy_raw)
        for flag, n in ((False, len(with_bos)), (True, len(raw))):
            beam = await complete(http, **body, use_beam_search=True, use_raw_prompt=flag)
            assert beam["usage"]["prompt_tokens"] == n


async def test_choices_of_a_prompt_list_are_numbered_and_offset_per_choice(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    prompts = ["The quick brown", "Paged attention keeps"]
    body = {"prompt": prompts, "n": 2, "max_tokens": 4, "temperature": 1.0, "seed": 3, "logprobs": 1, "echo": True, "ignore_eos": True}
    out = await complete(http, **body)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    for c in out["choices"]:
        prompt = prompts[c["index"] // 2]
        assert c["text"].startswith(prompt)
        got = c["logprobs"]
        n = len(ref.encode(prompt))
        # Offsets into this choice's own text: from 0, each token right after the previous
        # one, the generated text right after the echoed prompt.
        assert got["text_offset"][0] == 0
        assert got["text_offset"][n] == len(prompt)
        for j in range(len(got["tokens"]) - 1):
            assert got["text_offset"][j + 1] - got["text_offset"][j] == len(got["tokens"][j]), (c["index"], j)
    # Streamed, the choices carry the same indices and offsets.
    events = await stream_events(http, "/v1/completions", **{**body, "echo": False})
    offsets: dict[int, list[int]] = {}
    for e in events:
        for c in e["choices"]:
            offsets.setdefault(c["index"], []).extend(c["logprobs"]["text_offset"] if c["logprobs"] else [])
    assert sorted(offsets) == [0, 1, 2, 3]
    assert all(o[0] == 0 for o in offsets.values())
