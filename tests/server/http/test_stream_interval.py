"""`--stream-interval N` (runtime/mailbox.py): a stream's tokens reach the client in chunks of
at least N, past the first token (sent at once) and but for the last, and the text the openai
SDK's stream helper accumulates is the non-streamed text."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import trio

from tests.support.servers import start_server, tiny_config
from tests.support.waiting import in_thread

INTERVAL = 4
MAX_TOKENS = 14


def _chat(client: openai.OpenAI) -> tuple[str, list[int], str]:
    """(the streamed text the SDK's helper accumulated, tokens per content chunk, the whole text)."""
    body = dict(
        model="tiny", messages=[{"role": "user", "content": "count with me"}], max_tokens=MAX_TOKENS, temperature=0, logprobs=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    sizes = []
    with client.chat.completions.stream(**body) as stream:  # type: ignore[call-overload]
        for event in stream:
            if event.type == "chunk" and event.chunk.choices and event.chunk.choices[0].logprobs is not None:
                sizes.append(len(event.chunk.choices[0].logprobs.content or []))
        try:
            final = stream.get_final_completion()
        except openai.LengthFinishReasonError as exc:  # the helper's way of saying max_tokens ended it
            final = exc.completion
        streamed = final.choices[0].message.content or ""
    whole = client.chat.completions.create(**body).choices[0].message.content or ""  # type: ignore[call-overload]
    return streamed, sizes, whole


async def test_tokens_go_out_n_at_a_time_after_the_first_and_add_up_to_the_whole(tiny_model_dir: Path) -> None:
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery, tiny_config(tiny_model_dir, stream_interval=INTERVAL))
        with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=60) as client:
            streamed, sizes, whole = await in_thread(_chat, client)
        server.stop.set()
    assert streamed == whole
    assert sum(sizes) == MAX_TOKENS
    assert sizes[0] == 1  # the first token is not held: time to first token is unchanged
    assert all(size >= INTERVAL for size in sizes[1:-1]), sizes
    assert len(sizes) <= 2 + (MAX_TOKENS - 1) // INTERVAL, sizes  # one per token would be 14


def test_a_models_table_takes_a_stream_interval_and_refuses_a_bad_one(tmp_path: Path) -> None:
    from api.process.config_file import model_configs, read_config_file
    from runtime.config import RuntimeConfig

    config = tmp_path / "switchyard.toml"
    config.write_text('[[models]]\nname = "a"\nmodel = "/t"\nstream_interval = 3\n')
    (served,) = model_configs(RuntimeConfig(), read_config_file(str(config)), with_embeddings=False)
    assert served.stream_interval == 3
    for bad in ("0", "2.5", '"4"', "true"):
        config.write_text(f'[[models]]\nname = "a"\nmodel = "/t"\nstream_interval = {bad}\n')
        with pytest.raises(SystemExit, match=r"models\[0\]\.stream_interval must be a whole number"):
            read_config_file(str(config))
