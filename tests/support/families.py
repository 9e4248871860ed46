"""Model families' tokenizers for the tool-format tests: real vocabularies, the family's special
tokens at their real ids, and the family's real chat template (tests/support/family_assets.py).

Where llama.cpp's vocabulary files lack a family's tokens (they predate them), the base
vocabulary gets them at the ids the family's own tokenizer gives them: Qwen2.5's `<tool_call>`
(151657, `special: false`), Llama 3.1's `<|python_tag|>` (128010). Mistral's comes whole from
mistral-common (v3: `[TOOL_CALLS]` is 5; v7 with `[ARGS]`, `[CALL_ID]`, `[THINK]` and
`[/THINK]` in control slots 32-35, as in Mistral's later tokenizers). Where no vocabulary is at hand (Granite 3,
gpt-oss's and Phi-4-mini's o200k, DeepSeek V3, LFM2), a base vocabulary carries the family's special tokens at
their ids (padded up to them), which is what a grammar, a template and a parser see of it.
Each tokenizer is built once and cached beside the assets.
"""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.family_assets import assets_dir, llama_cpp_file, mistral_model, template

CACHE_VERSION = "3"


@dataclass(frozen=True)
class Family:
    name: str
    template: str  # llama.cpp's template file (no .jinja)
    build: Callable[[], Any]  # the tokenizer, without its template
    tool_format: str  # what runtime/tool_formats.py must detect from the template
    call: str  # the model's own call of get_weather(city="Paris"), as it writes it
    eos: str
    calls2: str | None = None  # its two calls, Paris then London, in one turn (None: one call a turn)


def _gguf_bpe(path: Path, added: dict[int, tuple[str, bool]], eos: str = "", bos: str | None = None) -> Any:
    """A byte-level BPE tokenizer from a llama.cpp vocabulary file: its normal tokens and merges,
    then every token from its first special one on as an added token at its own id (`added`
    renames some, (content, special); ids past the file's are reserved tokens up to them)."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    reader = GGUFReader(str(path))
    field = reader.fields["tokenizer.ggml.tokens"]
    types = reader.fields["tokenizer.ggml.token_type"]
    tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    kinds = [int(types.parts[i][0]) for i in types.data]
    merges_field = reader.fields["tokenizer.ggml.merges"]
    merges = [tuple(bytes(merges_field.parts[i]).decode("utf-8").split(" ", 1)) for i in merges_field.data]
    first = next(i for i, kind in enumerate(kinds) if kind != 1)
    size = max(len(tokens), max(added, default=0) + 1)
    vocab = {tokens[i]: i for i in range(first)}
    rest = [added.get(i, (tokens[i] if i < len(tokens) else f"<|reserved_{i}|>", True)) for i in range(first, size)]
    taken = {content for i, (content, _) in enumerate(rest, first) if i in added}
    rest = [(f"<|reserved_{i}|>", True) if i not in added and content in taken else (content, special) for i, (content, special) in enumerate(rest, first)]
    # Every id is in the model's vocabulary (an added token keeps its id there); the padding is
    # only that, tokens no merge makes, as a real vocabulary's unused ids are (not ~48k added
    # tokens, which the grammar's vocabulary would take seconds to read).
    vocab |= {content: i for i, (content, _) in enumerate(rest, first)}
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    padding = {i for i in range(len(tokens), size) if i not in added}
    bpe.add_tokens([AddedToken(content, special=special, normalized=False) for i, (content, special) in enumerate(rest, first) if i not in padding])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=eos, bos_token=bos)


def _mistral(model: str, renamed: dict[int, str]) -> Any:
    """Mistral's own SentencePiece tokenizer (mistral-common), control tokens renamed where asked."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    work = assets_dir() / "work" / model
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(mistral_model(model), work / "tokenizer.model")
    (work / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "legacy": False})
    )
    tok = AutoTokenizer.from_pretrained(work)
    if not renamed:
        return tok
    data = json.loads(tok.backend_tokenizer.to_str())
    for entry in data["added_tokens"]:
        if entry["id"] in renamed:
            entry["content"] = renamed[entry["id"]]
    vocab = data["model"]["vocab"]
    for key, value in list(vocab.items()) if isinstance(vocab, dict) else []:
        if value in renamed:
            vocab[renamed[value]] = vocab.pop(key)
    from tokenizers import Tokenizer

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)), bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _smollm2_with(added: list[tuple[str, bool]], eos: str) -> Any:
    """The embedded SmolLM2's vocabulary (49152, StarCoder's, as Granite 3's is) with `added` after it."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    from runtime.model_store import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model(None)[1])
    tok.add_tokens([AddedToken(content, special=special, normalized=False) for content, special in added])
    tok.eos_token = eos
    return tok


QWEN25 = {151643: ("<|endoftext|>", True), 151644: ("<|im_start|>", True), 151645: ("<|im_end|>", True)}
QWEN25 |= {151657: ("<tool_call>", False), 151658: ("</tool_call>", False)}
QWEN3 = QWEN25 | {151665: ("<tool_response>", False), 151666: ("</tool_response>", False), 151667: ("<think>", False), 151668: ("</think>", False)}
HARMONY = {199998: ("<|startoftext|>", True), 199999: ("<|endoftext|>", True), 200002: ("<|return|>", True), 200003: ("<|constrain|>", True)}
HARMONY |= {200005: ("<|channel|>", True), 200006: ("<|start|>", True), 200007: ("<|end|>", True), 200008: ("<|message|>", True), 200012: ("<|call|>", True)}
DEEPSEEK = {100000: ("<｜begin▁of▁sentence｜>", True), 100001: ("<｜end▁of▁sentence｜>", True)}
DEEPSEEK |= {128798: ("<think>", False), 128799: ("</think>", False), 128803: ("<｜User｜>", False), 128804: ("<｜Assistant｜>", False)}
DEEPSEEK |= {
    i: (t, False)
    for i, t in zip(
        range(128806, 128815),
        (
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁outputs▁begin｜>",
            "<｜tool▁outputs▁end｜>",
            "<｜tool▁output▁begin｜>",
            "<｜tool▁output▁end｜>",
            "<｜tool▁sep｜>",
        ),
    )
}
PHI4_MINI = {199999: ("<|endoftext|>", True), 200018: ("<|endofprompt|>", True), 200019: ("<|assistant|>", True), 200020: ("<|end|>", True)}
PHI4_MINI |= {200021: ("<|user|>", True), 200022: ("<|system|>", True), 200023: ("<|tool|>", True), 200024: ("<|/tool|>", True)}
PHI4_MINI |= {200025: ("<|tool_call|>", True), 200026: ("<|/tool_call|>", True), 200027: ("<|tool_response|>", True), 200028: ("<|tag|>", True)}
# Phi-4-mini-instruct's chat template as its tokenizer_config.json ships it (MIT licence; not in
# llama.cpp's set): the tools are a JSON string on the system message, between <|tool|> tokens.
INLINE_TEMPLATES = {
    "microsoft-Phi-4-mini-instruct": "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] is not none %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' + '<|end|>' }}"
    "{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}"
}
HERMES2 = "\n".join(f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{c}"}}}}\n</tool_call>' for c in ("Paris", "London"))
ARGS2 = "".join(f'[TOOL_CALLS]get_weather[ARGS]{{"city": "{c}"}}' for c in ("Paris", "London"))

FAMILIES = {
    "qwen2.5": Family(
        "qwen2.5",
        "Qwen-Qwen2.5-7B-Instruct",
        lambda: _gguf_bpe(llama_cpp_file("models/ggml-vocab-qwen2.gguf"), QWEN25, eos="<|im_end|>"),
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "<|im_end|>",
        HERMES2,
    ),
    "llama3.1": Family(
        "llama3.1",
        "meta-llama-Llama-3.1-8B-Instruct",
        lambda: _gguf_bpe(
            llama_cpp_file("models/ggml-vocab-llama-bpe.gguf"),
            {128008: ("<|eom_id|>", True), 128010: ("<|python_tag|>", True)},
            eos="<|eot_id|>",
            bos="<|begin_of_text|>",
        ),
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "<|eot_id|>",
    ),
    "mistral-nemo": Family(
        "mistral-nemo",
        "mistralai-Mistral-Nemo-Instruct-2407",
        lambda: _mistral("mistral_instruct_tokenizer_240323.model.v3", {}),
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        "</s>",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "London"}}]',
    ),
    "mistral-small-3.2": Family(
        "mistral-small-3.2",
        "Mistral-Small-3.2-24B-Instruct-2506",
        lambda: _mistral("mistral_instruct_tokenizer_241114.model.v7", {32: "[ARGS]", 33: "[CALL_ID]"}),
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        "</s>",
        ARGS2,
    ),
    "granite-3.3": Family(
        "granite-3.3",
        "ibm-granite-granite-3.3-2B-Instruct",
        lambda: _smollm2_with([("<|start_of_role|>", True), ("<|end_of_role|>", True), ("<|tool_call|>", True)], "<|endoftext|>"),
        "granite",
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        "<|endoftext|>",
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "London"}}]',
    ),
    "deepseek-v3.1": Family(
        "deepseek-v3.1",
        "deepseek-ai-DeepSeek-V3.1",
        lambda: _gguf_bpe(llama_cpp_file("models/ggml-vocab-deepseek-llm.gguf"), DEEPSEEK, eos="<｜end▁of▁sentence｜>", bos="<｜begin▁of▁sentence｜>"),
        "deepseek_v3",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "<｜end▁of▁sentence｜>",
        "<｜tool▁calls▁begin｜>"
        + "".join(f'<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{{"city": "{c}"}}<｜tool▁call▁end｜>' for c in ("Paris", "London"))
        + "<｜tool▁calls▁end｜>",
    ),
    "qwen3": Family(
        "qwen3",
        "Qwen-Qwen3-0.6B",
        lambda: _gguf_bpe(llama_cpp_file("models/ggml-vocab-qwen2.gguf"), QWEN3, eos="<|im_end|>"),
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "<|im_end|>",
        HERMES2,
    ),
    "magistral": Family(
        "magistral",
        "mistralai-Ministral-3-14B-Reasoning-2512",
        lambda: _mistral("mistral_instruct_tokenizer_241114.model.v7", {32: "[ARGS]", 33: "[CALL_ID]", 34: "[THINK]", 35: "[/THINK]"}),
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        "</s>",
        ARGS2,
    ),
    "qwen3-coder": Family(
        "qwen3-coder",
        "Qwen3-Coder",
        lambda: _gguf_bpe(llama_cpp_file("models/ggml-vocab-qwen2.gguf"), QWEN3, eos="<|im_end|>"),
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        "<|im_end|>",
        "\n".join(f"<tool_call>\n<function=get_weather>\n<parameter=city>\n{c}\n</parameter>\n</function>\n</tool_call>" for c in ("Paris", "London")),
    ),
    "lfm2.5": Family(
        "lfm2.5",
        "LFM2.5-8B-A1B",
        lambda: _smollm2_with(
            [
                ("<|startoftext|>", True),
                ("<|tool_call_start|>", True),
                ("<|tool_call_end|>", True),
                ("<|tool_list_start|>", True),
                ("<|tool_list_end|>", True),
                ("<|tool_response_start|>", True),
                ("<|tool_response_end|>", True),
            ],
            "<|im_end|>",
        ),
        "pythonic",
        "<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>",
        "<|im_end|>",
        "<|tool_call_start|>[get_weather(city='Paris'), get_weather(city='London')]<|tool_call_end|>",
    ),
    "phi-4-mini": Family(
        "phi-4-mini",
        "microsoft-Phi-4-mini-instruct",
        lambda: _gguf_bpe(llama_cpp_file("models/ggml-vocab-qwen2.gguf"), PHI4_MINI, eos="<|end|>"),
        "phi4_mini_json",
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>',
        "<|end|>",
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": {"city": "London"}}]<|/tool_call|>',
    ),
    "gpt-oss": Family(
        "gpt-oss",
        "openai-gpt-oss-120b",
        lambda: _gguf_bpe(llama_cpp_file("models/ggml-vocab-qwen2.gguf"), HARMONY, eos="<|return|>"),
        "openai",
        '<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
        "<|call|>",
    ),
}


@functools.cache
def family_tokenizer(name: str) -> Any:
    """The family's tokenizer with its chat template, built once and cached (on disk, and this
    object for the process: its grammar vocabulary is then built once too, actors/guidance.py)."""
    from transformers import AutoTokenizer

    family = FAMILIES[name]
    where = assets_dir() / "tokenizers" / f"{name}-{CACHE_VERSION}"
    if not (where / "tokenizer.json").exists():
        tok = family.build()
        tok.chat_template = INLINE_TEMPLATES.get(family.template) or template(family.template)
        tok.save_pretrained(where)
    return AutoTokenizer.from_pretrained(where)


# The scripted conversation of the format tests: a weather tool, the questions, the answers.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
ANSWER = "It is 21 degrees in Paris."
ASK2 = [{"role": "user", "content": "What is the weather in Paris and in London?"}]
NO_TOOLS = "I cannot look that up."


def answer_for(family: Family) -> Callable[[str], str]:
    """The scripted model: the family's own call (both, asked for two cities, where the format
    takes two a turn), the answer once the tool's result is in the prompt, and a plain answer
    when it is shown no tools."""

    def answer(prompt: str) -> str:
        if "get_weather" not in prompt or "21" in prompt:
            text = ANSWER if "21" in prompt else NO_TOOLS
            return f"<|channel|>final<|message|>{text}<|return|>" if family.tool_format == "openai" else text
        if "London" not in prompt:
            return family.call
        # Magistral thinks before it answers, as its system prompt asks (its grammar starts after)
        return ("[THINK]Two cities.[/THINK]" if family.name == "magistral" else "") + (family.calls2 or family.call)

    return answer


RESPONSES_WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city.", "parameters": WEATHER["function"]["parameters"]}
