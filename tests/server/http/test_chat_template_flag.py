"""`--chat-template FILE` (`chat_template` in TOML): a model that ships no template answers chat
requests with a 400 until given one; given Llama 3.1's real template (llama.cpp's copy), it
renders with it and its tool-call format is read from it. A file that cannot be read or is no
Jinja template is refused at start in one line, exit 2 (the real CLI, nothing loaded)."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio

from tests.support.cli import assert_one_line_usage_error, run_cli
from tests.support.family_assets import template
from tests.support.servers import start_server, tiny_config
from tests.support.tiny_model import build_tiny_decoder

ASK = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


async def test_a_model_without_a_template_is_served_with_the_files(tmp_path: Path) -> None:
    model = build_tiny_decoder(tmp_path / "m", "llama", tokenizer_options={"template": None})
    llama = tmp_path / "llama31.jinja"
    llama.write_text(await trio.to_thread.run_sync(template, "meta-llama-Llama-3.1-8B-Instruct"))
    answers = {}
    for given in (None, str(llama)):
        async with trio.open_nursery() as nursery:
            server = await start_server(nursery, tiny_config(model, chat_template=given))
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
                answers[given] = ((await client.post("/v1/chat/completions", json=ASK)), (await client.get("/v1/models")).json())
            server.stop.set()
    (bare, _), (templated, card) = answers[None], answers[str(llama)]
    assert bare.status_code == 400, bare.text
    assert templated.status_code == 200, templated.text
    assert templated.json()["usage"]["prompt_tokens"] > 20  # Llama 3.1's header and date lines around "Hi"
    assert card["data"][0]["tool_call_parser"] == "llama3_json"


def test_a_bad_template_file_is_refused_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }}")
    proc = run_cli("serve", "--chat-template", str(bad), "--no-embeddings", tmp_path=tmp_path)
    assert_one_line_usage_error(proc, "--chat-template", "not a Jinja template")
    proc = run_cli("serve", "--chat-template", str(tmp_path / "missing.jinja"), "--no-embeddings", tmp_path=tmp_path)
    assert_one_line_usage_error(proc, "--chat-template", "cannot be read")
