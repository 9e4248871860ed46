"""--spec-decoding draft refuses, at once, a draft model that cannot draft for its target: one line
naming the flag, exit status 2, no model loaded (runtime/draft_models.py).

The model directories here are config.json and tokenizer.json alone: the check reads no weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actors.runners.native.families import ARCHITECTURES as SUPPORTED
from runtime.config import RuntimeConfig
from runtime.draft_models import draft_error
from tests.support.cli import assert_one_line_usage_error, run_cli


def model_dir(path: Path, vocab: list[str], architecture: str = "LlamaForCausalLM", **config: object) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"architectures": [architecture], "model_type": "llama", "vocab_size": len(vocab), **config}))
    document = {"model": {"type": "BPE", "vocab": {token: i for i, token in enumerate(vocab[:-1])}}, "added_tokens": [{"id": len(vocab) - 1, "content": vocab[-1]}]}
    (path / "tokenizer.json").write_text(json.dumps(document))
    return path


VOCAB = ["a", "b", "c", "<|end|>"]


def test_draft_without_a_draft_model_fails_at_once(tmp_path: Path) -> None:
    target = model_dir(tmp_path / "target", VOCAB)
    proc = run_cli("serve", "--model", str(target), "--spec-decoding", "draft", "--no-embeddings", tmp_path=tmp_path)
    assert_one_line_usage_error(proc, "--spec-decoding draft", "--draft-model")


def test_a_draft_model_with_another_tokenizer_fails_at_once(tmp_path: Path) -> None:
    target = model_dir(tmp_path / "target", VOCAB)
    draft = model_dir(tmp_path / "draft", ["a", "c", "b", "<|end|>"])
    proc = run_cli("serve", "--model", str(target), "--spec-decoding", "draft", "--draft-model", str(draft), "--no-embeddings", tmp_path=tmp_path)
    assert_one_line_usage_error(proc, "--draft-model", str(draft), "tokenizer differs", "'b'")


def test_a_vision_language_target_cannot_draft(tmp_path: Path) -> None:
    target = model_dir(tmp_path / "target", VOCAB, "LlavaForConditionalGeneration", model_type="llava")
    draft = model_dir(tmp_path / "draft", VOCAB)
    proc = run_cli("serve", "--model", str(target), "--spec-decoding", "draft", "--draft-model", str(draft), "--no-embeddings", tmp_path=tmp_path)
    assert_one_line_usage_error(proc, "--spec-decoding draft", "vision-language")


def test_the_config_file_names_the_table(tmp_path: Path) -> None:
    target = model_dir(tmp_path / "target", VOCAB)
    config = tmp_path / "switchyard.toml"
    config.write_text(f'[[models]]\nname = "a"\nmodel = "{target}"\nspec_decoding = "draft"\n')
    proc = run_cli("serve", "--config", str(config), tmp_path=tmp_path)
    assert_one_line_usage_error(proc, str(config), "models[0]", "--draft-model")


@pytest.mark.parametrize(
    ("draft_vocab", "architecture", "spec", "words"),
    [
        pytest.param([*VOCAB, "d"], "LlamaForCausalLM", "draft", ("vocabulary has 5 tokens, the target's 4",), id="vocab-size"),
        pytest.param(VOCAB, "GPT2LMHeadModel", "draft", ("GPT2LMHeadModel", "native path"), id="not-native"),
        pytest.param(VOCAB, "LlamaForCausalLM", "ngram", ("--draft-model", "only with --spec-decoding draft"), id="flag-alone"),
        pytest.param(None, "LlamaForCausalLM", "draft", ("--draft-model", "no such directory"), id="missing"),
    ],
)
def test_what_is_refused(tmp_path: Path, draft_vocab: list[str] | None, architecture: str, spec: str, words: tuple[str, ...]) -> None:
    target = model_dir(tmp_path / "target", VOCAB)
    draft = model_dir(tmp_path / "draft", draft_vocab, architecture) if draft_vocab else tmp_path / "absent"
    error = draft_error(RuntimeConfig(model=str(target), spec_decoding=spec, draft_model=str(draft)), SUPPORTED)
    assert error is not None and all(word in error for word in words), error


def test_what_is_allowed(tmp_path: Path) -> None:
    target = model_dir(tmp_path / "target", VOCAB)
    draft = model_dir(tmp_path / "draft", VOCAB, "Qwen2ForCausalLM", hidden_size=32)
    assert draft_error(RuntimeConfig(model=str(target), spec_decoding="draft", draft_model=str(draft)), SUPPORTED) is None
    assert draft_error(RuntimeConfig(model=str(target), spec_decoding="ngram"), SUPPORTED) is None
    # auto drafts with the draft model when one is given (and checks it as draft does), else n-grams.
    with_model = RuntimeConfig(model=str(target), spec_decoding="auto", draft_model=str(draft))
    assert with_model.drafter() == "draft" and draft_error(with_model, SUPPORTED) is None
    assert RuntimeConfig(model=str(target), spec_decoding="auto").drafter() == "ngram"
    other = model_dir(tmp_path / "other", [*VOCAB, "d"])
    assert "vocabulary" in (draft_error(RuntimeConfig(model=str(target), spec_decoding="auto", draft_model=str(other)), SUPPORTED) or "")
    # The embedding model served beside it inherits the flags and ignores them.
    assert draft_error(RuntimeConfig(task="embeddings", spec_decoding="draft"), SUPPORTED) is None


def test_auto_is_the_default_and_drafts_only_where_rows_are_computed_alone(tmp_path: Path) -> None:
    from api.process.flags import parse_args

    assert RuntimeConfig().spec_decoding == "auto" and RuntimeConfig().drafter() == "ngram"  # the runner's rows are row-invariant
    assert parse_args(["serve"]).config.spec_decoding == "auto"
    assert RuntimeConfig(spec_decoding="off").drafter() == "off"
    assert RuntimeConfig(spec_decoding="auto").drafter(rowwise=False) == "off"  # a verify row could round otherwise
    assert RuntimeConfig(batch_invariant=False, spec_decoding="auto").drafter() == "off"
    assert RuntimeConfig(batch_invariant=False, spec_decoding="ngram").drafter(rowwise=False) == "ngram"  # asked for by name: drafts
    target, draft = model_dir(tmp_path / "target", VOCAB), model_dir(tmp_path / "draft", VOCAB, "Qwen2ForCausalLM", hidden_size=32)
    error = draft_error(RuntimeConfig(model=str(target), batch_invariant=False, spec_decoding="auto", draft_model=str(draft)), SUPPORTED)
    assert error is not None and "--no-batch-invariant" in error and "--spec-decoding draft" in error, error


def test_a_models_table_takes_a_draft_model(tmp_path: Path) -> None:
    from api.process.config_file import model_configs, read_config_file

    config = tmp_path / "switchyard.toml"
    config.write_text('[[models]]\nname = "a"\nmodel = "/t"\nspec_decoding = "draft"\ndraft_model = "/d"\n')
    (served,) = model_configs(RuntimeConfig(), read_config_file(str(config)), with_embeddings=False)
    assert (served.spec_decoding, served.draft_model) == ("draft", "/d")
