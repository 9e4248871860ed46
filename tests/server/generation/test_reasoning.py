"""Reasoning models over HTTP: thinking kept apart from the answer on every surface,
counted in usage, and controlled by reasoning_effort.

The engine is real (tokenizer, scheduler core, detokenizer, the app on a socket) around a
scripted runner (tests/support/tiny_thinking.py `ThinkingRunner`): it thinks " a" until its
thinking ends (it writes `</think>` after `thoughts` tokens, or a budget forces it), then
answers "ok". The tokenizer and templates have Qwen3's and DeepSeek-R1's shapes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
import trio

from runtime.config import RuntimeConfig
from tests.support.servers import Server, start_runtime_server
from tests.support.tiny_thinking import OPEN_TEMPLATE, QWEN3_TEMPLATE, build_thinking_model, thinking_runtime
from tests.support.waiting import in_thread

MESSAGES = [{"role": "user", "content": "Why?"}]


@pytest.fixture(scope="module")
def open_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.tiny_model import build_tokenizer
    from tests.support.tiny_thinking import THINK_TOKENS

    path = tmp_path_factory.mktemp("think-open")
    build_tokenizer(path, added=THINK_TOKENS, template=OPEN_TEMPLATE)
    return path


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.tiny_model import build_tokenizer
    from tests.support.tiny_thinking import THINK_TOKENS

    path = tmp_path_factory.mktemp("think-qwen")
    build_tokenizer(path, added=THINK_TOKENS, template=QWEN3_TEMPLATE)
    return path


@asynccontextmanager
async def thinker(model_dir: Path, budgets: dict[str, int] | None = None, **runner: Any) -> AsyncIterator[Server]:
    config = RuntimeConfig(served_name="thinker", port=0, drain_timeout=2.0, reasoning_budgets=budgets or {})
    runtime = thinking_runtime(model_dir, config, **runner)
    async with trio.open_nursery() as nursery:
        srv = await start_runtime_server(nursery, runtime)
        try:
            yield srv
        finally:
            srv.stop.set()


def sdk(srv: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.openai_url, api_key="unused", max_retries=0, timeout=60)


async def post(srv: Server, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(base_url=srv.base_url, timeout=60, headers={"Connection": "close"}) as http:
        return await http.post(path, json=body, headers=headers)


async def test_chat_message_and_stream_keep_thinking_apart_and_count_it(open_dir: Path) -> None:
    async with thinker(open_dir, thoughts=3) as srv:

        def run() -> tuple[Any, list[Any]]:
            with sdk(srv) as client:
                whole = client.chat.completions.create(model="thinker", messages=MESSAGES, max_tokens=20)
                chunks = list(client.chat.completions.create(model="thinker", messages=MESSAGES, max_tokens=20, stream=True, stream_options={"include_usage": True}))
                return whole, chunks

        whole, chunks = await in_thread(run)
        models = (await httpx.AsyncClient(base_url=srv.base_url).get("/v1/models")).json()
    message = whole.choices[0].message
    assert message.content == "ok" and message.reasoning == "a a a" and message.reasoning_content == "a a a"  # type: ignore[attr-defined]
    usage = whole.usage
    # " a" x3 and `</think>` thought, then "ok" and EOS: reasoning + answer tokens = completion tokens
    assert usage.completion_tokens_details.reasoning_tokens == 4
    assert usage.completion_tokens == 4 + 3  # then "ok" (two tokens in this vocabulary) and EOS
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning", None) or "" for d in deltas) == "a a a"
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "a a a"
    assert "".join(d.content or "" for d in deltas) == "ok"
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 4 and chunks[-1].usage.completion_tokens == usage.completion_tokens
    assert models["data"][0]["reasoning"]["parser"] == "deepseek_r1"


async def test_thinking_cut_by_max_tokens_is_all_reasoning(open_dir: Path) -> None:
    async with thinker(open_dir) as srv:
        whole = (await post(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 5})).json()
        chunks = (await post(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 5, "stream": True})).text
    message = whole["choices"][0]["message"]
    assert message["content"] == "" and message["reasoning"] == "a a a a a"
    assert whole["usage"]["completion_tokens_details"]["reasoning_tokens"] == whole["usage"]["completion_tokens"] == 5
    streamed = [json.loads(line[6:]) for line in chunks.splitlines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("reasoning", "") for c in streamed if c["choices"]) == "a a a a a"


async def test_effort_low_stops_thinking_at_the_budget_and_the_answer_follows(open_dir: Path) -> None:
    async with thinker(open_dir, budgets={"low": 4}) as srv:
        body = (await post(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 30, "reasoning_effort": "low"})).json()
    message = body["choices"][0]["message"]
    assert message["reasoning"] == "a a a a" and message["content"] == "ok"
    usage = body["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] >= 5  # the budget, then the forced `\n</think>`
    assert body["choices"][0]["finish_reason"] == "stop"


async def test_effort_none_turns_qwen3_thinking_off(qwen_dir: Path) -> None:
    async with thinker(qwen_dir, opens=True, thoughts=2) as srv:
        off = (await post(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 20, "reasoning_effort": "none"})).json()
        on = (await post(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 20})).json()
        kept = (await post(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 20, "reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}})).json()
        bad = await post(srv, "/v1/chat/completions", {"messages": MESSAGES, "reasoning_effort": "extreme"})
    assert off["choices"][0]["message"]["reasoning"] is None and off["choices"][0]["message"]["content"] == "ok"
    assert off["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    assert on["choices"][0]["message"]["reasoning"] == "a a" and on["choices"][0]["message"]["content"] == "ok"
    assert on["usage"]["completion_tokens_details"]["reasoning_tokens"] == 4  # <think>, " a" x2, </think>
    assert kept["choices"][0]["message"]["reasoning"] == "a a"  # an explicit chat_template_kwargs wins
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"


@pytest.mark.parametrize("lead", ["\n", "\n\n "])
async def test_thinking_opened_after_whitespace_is_counted_and_budgeted(qwen_dir: Path, lead: str) -> None:
    """A model that writes whitespace before `<think>` (`\n<think>`, as Qwen3 and R1 models
    may): the text parser drops it and reads the thinking, and the token tracker agrees: the
    whitespace and the tag count as reasoning tokens, and a budget applies."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen_dir)
    opening = len(tokenizer.encode(lead, add_special_tokens=False)) + 1  # the whitespace, then `<think>`
    forced = tokenizer.encode("\n</think>\n\n", add_special_tokens=False)
    end = forced.index(tokenizer.encode("</think>", add_special_tokens=False)[0]) + 1
    answer_tokens = len(tokenizer.encode("ok", add_special_tokens=False)) + 1
    async with thinker(qwen_dir, budgets={"low": opening + 2}, opens=True, lead=lead) as srv:
        cut = (await post(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": opening + 3})).json()
        low = (await post(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 30, "reasoning_effort": "low"})).json()
    message, usage = cut["choices"][0]["message"], cut["usage"]
    assert message["reasoning"] == "a a a" and message["content"] == ""
    assert usage["completion_tokens_details"]["reasoning_tokens"] == usage["completion_tokens"] == opening + 3  # all of it thought
    message, usage = low["choices"][0]["message"], low["usage"]
    assert message["reasoning"] == "a a" and message["content"] == "ok"  # the budget: the whitespace, the tag and two thoughts
    assert usage["completion_tokens_details"]["reasoning_tokens"] == opening + 2 + end
    assert usage["completion_tokens"] == opening + 2 + len(forced) + answer_tokens


async def test_responses_reasoning_item_events_and_usage(open_dir: Path) -> None:
    async with thinker(open_dir, thoughts=2) as srv:

        def run() -> tuple[Any, list[Any], Any]:
            with sdk(srv) as client:
                whole = client.responses.create(model="thinker", input="Why?", max_output_tokens=20)
                with client.responses.stream(model="thinker", input="Why?", max_output_tokens=20) as stream:
                    events = list(stream)
                    final = stream.get_final_response()
                return whole, events, final

        whole, events, final = await in_thread(run)
        bad = await post(srv, "/v1/responses", {"input": "x", "reasoning": {"effort": "extreme"}})
        history = await post(srv, "/v1/responses", {"input": [
            {"role": "user", "content": "Why?"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "earlier"}]},
            {"role": "assistant", "content": "before"},
            {"role": "user", "content": "And?"},
        ], "max_output_tokens": 20})  # fmt: skip
    for response in (whole, final):
        reasoning, message = response.output
        assert reasoning.type == "reasoning" and reasoning.content[0].text == "a a" and reasoning.status == "completed"
        assert message.type == "message" and response.output_text == "ok"
        assert response.usage.output_tokens_details.reasoning_tokens == 3
    kinds = [e.type for e in events]
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "a a"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning.effort"
    assert history.status_code == 200 and history.json()["output"][-1]["content"][0]["text"] == "ok"


async def test_databricks_answers_in_content_blocks(open_dir: Path) -> None:
    async with thinker(open_dir, thoughts=2) as srv:
        body = (await post(srv, "/serving-endpoints/thinker/invocations", {"messages": MESSAGES, "max_tokens": 20})).json()
        compatible = (await post(srv, "/serving-endpoints/chat/completions", {"model": "thinker", "messages": MESSAGES, "max_tokens": 20})).json()
        azure = await post(srv, "/chat/completions?api-version=2024-05-01-preview", {"messages": MESSAGES, "max_tokens": 20})
    for answer in (body, compatible):
        assert answer["choices"][0]["message"]["content"] == [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "a a"}]},
            {"type": "text", "text": "ok"},
        ]
        assert answer["usage"]["reasoning_tokens"] == 3 == answer["usage"]["completion_tokens_details"]["reasoning_tokens"]
    message = azure.json()["choices"][0]["message"]
    assert message["content"] == "ok" and message["reasoning_content"] == "a a"  # Azure: as Chat


async def test_databricks_sdk_parses_the_content_blocks(open_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from databricks.sdk import WorkspaceClient
    from databricks.sdk.service.serving import ChatMessage, ChatMessageRole

    monkeypatch.setenv("DATABRICKS_CONFIG_FILE", str(tmp_path / "no-databrickscfg"))
    async with thinker(open_dir, thoughts=2) as srv:

        def run() -> Any:
            w = WorkspaceClient(host=srv.base_url, token="unused")
            return w.serving_endpoints.query("thinker", messages=[ChatMessage(role=ChatMessageRole.USER, content="Why?")], max_tokens=20)

        answer = await in_thread(run)
    content = answer.choices[0].message.content
    assert content[0]["summary"][0]["text"] == "a a" and content[1]["text"] == "ok"  # as Databricks' docs read it


def sse_data(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


async def every_surface(srv: Server, extra: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One request on every route that parses thinking, whole and streamed: each answer's
    (reasoning tokens, completion tokens) and what it said, thought and answered."""
    chat = {"messages": MESSAGES, "max_tokens": 30, **extra}
    effort = {"reasoning": {"effort": extra["reasoning_effort"]}} if "reasoning_effort" in extra else {}
    resp = {"input": "Why?", "max_output_tokens": 30, **effort}
    bodies = {
        "chat": (await post(srv, "/v1/chat/completions", chat)).json(),
        "databricks": (await post(srv, "/serving-endpoints/thinker/invocations", chat)).json(),
        # Azure's request has no reasoning_effort: the client passes it through
        "azure": (await post(srv, "/chat/completions?api-version=2024-05-01-preview", chat, {"extra-parameters": "pass-through"})).json(),
        "responses": (await post(srv, "/v1/responses", resp)).json(),
    }
    chunks = sse_data((await post(srv, "/v1/chat/completions", {**chat, "stream": True, "stream_options": {"include_usage": True}})).text)
    events = sse_data((await post(srv, "/v1/responses", {**resp, "stream": True})).text)
    out: dict[str, dict[str, Any]] = {}
    for name in ("chat", "databricks", "azure"):
        usage, message = bodies[name]["usage"], bodies[name]["choices"][0]["message"]
        content = message["content"]
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        thought = message.get("reasoning") or "".join(b["summary"][0]["text"] for b in blocks if b["type"] == "reasoning")
        answer = "".join(b["text"] for b in blocks if b["type"] == "text")
        out[name] = {"usage": (usage["completion_tokens_details"]["reasoning_tokens"], usage["completion_tokens"]), "thought": thought, "answer": answer}
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    out["chat stream"] = {
        "usage": (chunks[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"], chunks[-1]["usage"]["completion_tokens"]),
        "thought": "".join(d.get("reasoning", "") for d in deltas),
        "answer": "".join(d.get("content", "") for d in deltas),
    }
    for name, response in (("responses", bodies["responses"]), ("responses stream", events[-1]["response"])):
        usage, items = response["usage"], response["output"]
        out[name] = {
            "usage": (usage["output_tokens_details"]["reasoning_tokens"], usage["output_tokens"]),
            "thought": "".join(i["content"][0]["text"] for i in items if i["type"] == "reasoning"),
            "answer": "".join(c["text"] for i in items if i["type"] == "message" for c in i["content"]),
        }
    assert bodies["databricks"]["usage"]["reasoning_tokens"] == out["databricks"]["usage"][0]  # the Databricks reference's flat field
    return out


async def test_usage_adds_up_on_every_surface(open_dir: Path) -> None:
    """Reasoning tokens (the thinking and its end tag) + answer tokens (the answer and EOS) =
    completion tokens, on Chat, Responses, Databricks and Azure, whole and streamed."""
    from transformers import AutoTokenizer

    answer_tokens = len(AutoTokenizer.from_pretrained(open_dir).encode("ok", add_special_tokens=False)) + 1
    async with thinker(open_dir, thoughts=2) as srv:
        answers = await every_surface(srv, {})
    assert len(answers) == 6
    for name, got in answers.items():
        assert got == {"usage": (3, 3 + answer_tokens), "thought": "a a", "answer": "ok"}, name


async def test_effort_low_stops_thinking_at_the_budget_on_every_surface(open_dir: Path) -> None:
    """The runner would think forever: at the budget the server writes `\n</think>\n\n`, and
    the answer follows; what it wrote up to `</think>` counts as reasoning, within max_tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(open_dir)
    forced = tokenizer.encode("\n</think>\n\n", add_special_tokens=False)
    end = forced.index(tokenizer.encode("</think>", add_special_tokens=False)[0]) + 1
    answer_tokens = len(tokenizer.encode("ok", add_special_tokens=False)) + 1
    async with thinker(open_dir, budgets={"low": 4}) as srv:
        answers = await every_surface(srv, {"reasoning_effort": "low"})
        unbudgeted = (await post(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12})).json()
    for name, got in answers.items():
        assert got == {"usage": (4 + end, 4 + len(forced) + answer_tokens), "thought": "a a a a", "answer": "ok"}, name
    assert unbudgeted["choices"][0]["message"]["content"] == "" and unbudgeted["choices"][0]["finish_reason"] == "length"  # the control


async def test_a_model_that_does_not_think_answers_as_before(tmp_path: Path) -> None:
    """A model without a thinking template: its output (tags and all) is the answer on every
    route, no reasoning field appears, and reasoning_effort, any known value, changes nothing."""
    from tests.support.tiny_model import build_tokenizer

    build_tokenizer(tmp_path)
    text = "<think>x</think>y"

    def shape(body: Any) -> Any:  # the answer without what differs per request (ids, times, prefix cache hits)
        if isinstance(body, dict):
            return {k: shape(v) for k, v in body.items() if k not in ("id", "created", "created_at", "completed_at", "item_id", "call_id", "cached_tokens")}
        return [shape(v) for v in body] if isinstance(body, list) else body

    def streamed(chunks: list[dict[str, Any]]) -> Any:  # what a client reads of a stream however it was cut
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        return "".join(d.get("content", "") for d in deltas), sorted({k for d in deltas for k in d})

    def events(sse: list[dict[str, Any]]) -> Any:
        return sorted({e["type"] for e in sse}), shape(sse[-1]["response"])

    seen: dict[str | None, Any] = {}
    async with thinker(tmp_path, script=text) as srv:
        models = (await httpx.AsyncClient(base_url=srv.base_url).get("/v1/models")).json()
        for effort in (None, "none", "low", "high"):
            extra = {"reasoning_effort": effort} if effort else {}
            resp = {"input": "Why?", "max_output_tokens": 30, **({"reasoning": {"effort": effort}} if effort else {})}
            raw = [
                (await post(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 30, **extra})).json(),
                streamed(sse_data((await post(srv, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 30, "stream": True, **extra})).text)),
                (await post(srv, "/serving-endpoints/thinker/invocations", {"messages": MESSAGES, "max_tokens": 30, **extra})).json(),
                (await post(srv, "/chat/completions?api-version=2024-05-01-preview", {"messages": MESSAGES, "max_tokens": 30})).json(),
                (await post(srv, "/v1/responses", resp)).json(),
                events(sse_data((await post(srv, "/v1/responses", {**resp, "stream": True})).text)),
            ]
            seen[effort] = shape(raw)
    assert "reasoning" not in models["data"][0]
    chat, stream, databricks, azure, response, streamed_response = seen[None]
    for message in (chat["choices"][0]["message"], databricks["choices"][0]["message"], azure["choices"][0]["message"]):
        assert message["content"] == text and "reasoning" not in message and "reasoning_content" not in message
    for body in (chat, databricks, azure):
        assert "reasoning_tokens" not in body["usage"] and body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    assert stream == (text, ["content", "role"])
    assert [i["type"] for i in response["output"]] == ["message"] and response["output"][0]["content"][0]["text"] == text
    assert not any("reasoning" in kind for kind in streamed_response[0]) and streamed_response[1]["output"] == response["output"]
    for effort in ("none", "low", "high"):
        assert seen[effort][:3] == [chat, stream, databricks], effort  # the effort is ignored
        assert {**seen[effort][4], "reasoning": None} == {**response, "reasoning": None}, effort
        assert seen[effort][4]["reasoning"]["effort"] == effort  # Responses echoes what was asked


async def test_completions_stay_raw(open_dir: Path) -> None:
    async with thinker(open_dir, thoughts=1) as srv:
        body = (await post(srv, "/v1/completions", {"prompt": "Why?", "max_tokens": 10})).json()
    assert "</think>" in body["choices"][0]["text"]


# -- the real runner: a tiny random Qwen3 with a thinking template ------------------------------


@pytest.fixture(scope="module")
def qwen_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_thinking_model(tmp_path_factory.mktemp("tiny-qwen3-think"), OPEN_TEMPLATE)


@pytest.mark.parametrize("async_scheduling", [True, False])
async def test_a_budget_ends_thinking_and_the_grammar_constrains_only_the_answer(qwen_model_dir: Path, async_scheduling: bool) -> None:
    from tests.support.servers import start_server, tiny_config

    config = tiny_config(qwen_model_dir, reasoning_budgets={"low": 3}, async_scheduling=async_scheduling)
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, config)
        try:
            body = {"messages": MESSAGES, "max_tokens": 40, "reasoning_effort": "low", "temperature": 0, "response_format": {"type": "json_object"}}
            whole = (await post(srv, "/v1/chat/completions", body)).json()
            free = (await post(srv, "/v1/chat/completions", {**body, "response_format": None})).json()
        finally:
            srv.stop.set()
    for answer in (whole, free):
        usage = answer["usage"]
        # three thinking tokens, then the forced end of thinking (`\n</think>`, more without a grammar)
        assert 5 <= usage["completion_tokens_details"]["reasoning_tokens"] <= 6, answer
        assert usage["completion_tokens_details"]["reasoning_tokens"] < usage["completion_tokens"]
        assert "reasoning" in answer["choices"][0]["message"]  # (null when the random model's thoughts were whitespace)
    content = whole["choices"][0]["message"]["content"]
    assert content.lstrip().startswith("{"), whole  # the grammar started where thinking ended
    if whole["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(content), dict)


@pytest.fixture(scope="module")
def qwen_ref(qwen_model_dir: Path) -> Any:
    """The thinking model in transformers, float32: the logprobs' oracle."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.support.reference import Reference

    model = AutoModelForCausalLM.from_pretrained(qwen_model_dir, dtype=torch.float32).eval()
    return Reference(tokenizer=AutoTokenizer.from_pretrained(qwen_model_dir), model=model)


@pytest.mark.parametrize("engine", [{"async_scheduling": True}, {"async_scheduling": False}, {"spec_decoding": "ngram"}], ids=["async", "sync", "drafts"])
async def test_forced_tokens_have_the_models_logprobs_whole_and_streamed(qwen_model_dir: Path, qwen_ref: Any, engine: dict[str, Any]) -> None:
    """With logprobs on and a budget, every output token has its entry on Chat, whole and
    streamed: the forced end of thinking too, each with the model's log-probability at its
    position (transformers in float32 over the same tokens) and its top alternatives. The
    random model falls into loops after it, which n-gram drafts catch."""
    from tests.support.reference import TOL
    from tests.support.servers import start_server, tiny_config

    ref = qwen_ref
    forced = ref.tokenizer.encode("\n</think>\n\n", add_special_tokens=False)
    config = tiny_config(qwen_model_dir, reasoning_budgets={"low": 3}, **engine)
    body = {"messages": MESSAGES, "max_tokens": 24, "reasoning_effort": "low", "temperature": 0, "logprobs": True, "top_logprobs": 2}
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, config)
        try:
            whole = (await post(srv, "/v1/chat/completions", body)).json()
            chunks = sse_data((await post(srv, "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})).text)
        finally:
            srv.stop.set()
    content = whole["choices"][0]["logprobs"]["content"]
    streamed = [e for c in chunks if c["choices"] and c["choices"][0].get("logprobs") for e in c["choices"][0]["logprobs"]["content"]]
    assert len(content) == whole["usage"]["completion_tokens"] and len(streamed) == chunks[-1]["usage"]["completion_tokens"]
    assert [e["token"] for e in streamed] == [e["token"] for e in content]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in content], abs=TOL)  # (the prefix cache served the second)
    prompt = ref.chat_ids(MESSAGES)
    assert whole["usage"]["prompt_tokens"] == len(prompt)
    thoughts = ref.greedy(prompt, 3)
    assert not set(thoughts) & {forced[1], ref.eos}  # three thoughts, then the budget's end
    assert [e["token"] for e in content[3 : 3 + len(forced)]] == [ref.token_text(t) for t in forced]  # the forced entries carry the forced tokens
    answer = ref.greedy(prompt + thoughts + forced, len(content) - 3 - len(forced))
    assert [e["token"] for e in content] == [ref.token_text(t) for t in thoughts + forced + answer]
    lp = ref.logprobs(prompt + thoughts + forced + answer)
    for j, token in enumerate(thoughts + forced + answer):
        row = lp[len(prompt) + j - 1]
        assert content[j]["logprob"] == pytest.approx(float(row[token]), abs=TOL), j
        assert content[j]["top_logprobs"][0]["logprob"] == pytest.approx(float(row.max()), abs=TOL), j
