"""`--model FILE.gguf`: a GGUF file as llama.cpp users have it, served by path (runtime/model_store.py).

A tiny random Llama (the embedded SmolLM2's tokenizer and chat template, weights rounded to
float16, an untied head: a tied one's greedy output repeats one token) goes through llama.cpp's own converter into f16 and q8_0 files, and from f16 into Q4_0
with llama.cpp's reference rounding (tests/support/gguf_files.py). Each is converted once into
the store (tokenizer and chat template from the file, converted once for them all) and served: f16 in float32 gives the HF
model's greedy tokens exactly; q8_0 and Q4_0 keep their blocks as shipped (Q4_0 as the Q4_1
blocks of the same weights, checked against the dense conversion at conversion) and the
default bf16 serving of those blocks stays within a stated KL of transformers' own float32
loading of the file; a K-quant file (Q4_K) is served dense, converted once, with the
greedy tokens of transformers' own loading of them; a file too big for a float32 store is
kept in bf16 and served the same bits as from a float32 store. A GGUF of an architecture not served is refused in one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from actors.runners.runner_config import RunnerConfig
from runtime.model_store import gguf_error, resolve_model
from runtime.request import Prompt
from tests.support.equivalence import NUM_NEW, greedy_concurrently, reference
from tests.support.gguf_files import convert, quantize, requantize

KL_BOUND = 1e-4  # nats a position: bf16 serving of the blocks against float32 on the same weights (2e-6 measured)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, own_store: Path) -> dict[str, Path]:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("gguf")
    tokenizer = AutoTokenizer.from_pretrained(own_store)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())  # float16 exactly: the f16 file holds these weights bit for bit
    model.save_pretrained(root / "hf")
    tokenizer.save_pretrained(root / "hf")
    f16 = convert(root / "hf", root / "tiny-f16.gguf", "f16")
    made = {kind: requantize(f16, root / f"tiny-{kind}.gguf", kind) for kind in ("q4_0", "q4_k")}
    return {"hf": root / "hf", "f16": f16, "q8_0": convert(root / "hf", root / "tiny-q8_0.gguf", "q8_0"), **made}


@pytest.fixture(autouse=True, scope="module")
def own_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One store for the module: a file is converted once, whichever test serves it first. The
    embedded model's directory, found where it is before the store moves (its tokenizer)."""
    embedded = resolve_model(None)[1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SWITCHYARD_MODEL_STORE", str(tmp_path_factory.mktemp("store")))
        yield embedded


PROMPTS = [[1, 520, 3000, 17, 9, 4410], [2, 77, 15000, 301, 301, 88, 4, 6000, 12]]


async def test_an_f16_file_serves_the_models_own_tokens(files: dict[str, Path]) -> None:
    expected = reference(files["hf"], PROMPTS)
    got, _ = await greedy_concurrently(files["f16"], [Prompt(token_ids=p) for p in PROMPTS], NUM_NEW, 0.0, model_impl="native")
    assert got == expected and len({t for out in got for t in out}) > 4  # not one token repeated
    name, stored = resolve_model(str(files["f16"]))
    assert name == "tiny-f16" and (stored / "tokenizer.json").is_file() and "im_start" in (stored / "chat_template.jinja").read_text()
    # another quantization of the same model takes the tokenizer kept by vocabulary, the same files
    _, other = resolve_model(str(files["q8_0"]))
    assert len(list((stored.parent / ".tokenizers").iterdir())) == 1
    assert all((other / name).read_bytes() == (stored / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"))


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_blocks_are_served_as_shipped_within_the_bound(files: dict[str, Path], kind: str) -> None:
    from transformers import AutoModelForCausalLM

    from actors.runners.torch_runner import TorchRunner

    _, stored = resolve_model(str(files[kind]))
    assert (stored / "shipped.safetensors").is_file()
    runner = TorchRunner(stored, RunnerConfig(device="cpu", compile=False, num_kv_blocks=16, block_size=16))
    info = runner.load()
    assert info.impl.startswith("native+q4_1" if kind == "q4_0" else "native+q8_0"), info.impl
    own = AutoModelForCausalLM.from_pretrained(stored, dtype=torch.float32).eval()  # transformers' dequantization of the file, as stored
    worst = 0.0
    for prompt in PROMPTS:
        ids = torch.tensor(prompt)
        with torch.inference_mode():
            step, positions = runner.model.build_step([(0, len(prompt))], [[0]], 16, runner.k_cache, runner.v_cache)
            served = torch.log_softmax(runner.model.forward(ids, positions, step, torch.arange(len(prompt)), runner.k_cache, runner.v_cache).float(), -1)
            expected = torch.log_softmax(own(input_ids=ids[None]).logits[0], -1)
        kl = (expected.exp() * (expected - served)).sum(-1)
        worst = max(worst, float(kl.max()))
    print(f"{kind}: {info.impl}, KL per position at most {worst:.2g} nats")
    assert worst <= KL_BOUND


def _served(stored: Path, prompt: list[int]) -> torch.Tensor:
    from actors.runners.torch_runner import TorchRunner

    runner = TorchRunner(stored, RunnerConfig(device="cpu", compile=False, num_kv_blocks=16, block_size=16))
    runner.load()
    with torch.inference_mode():
        step, positions = runner.model.build_step([(0, len(prompt))], [[0, 1]], 16, runner.k_cache, runner.v_cache)
        logits = runner.model.forward(torch.tensor(prompt), positions, step, torch.arange(len(prompt)), runner.k_cache, runner.v_cache)
    return torch.log_softmax(logits.float(), -1)


def test_a_file_too_big_for_a_float32_store_is_kept_in_bf16(files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import shutil

    from runtime import model_store

    prompt = PROMPTS[1] + PROMPTS[0] + PROMPTS[1]  # 24 rows: the wide calls' dense copy serves them
    whole = _served(resolve_model(str(files["q4_0"]))[1], prompt)
    monkeypatch.setattr(model_store, "FLOAT32_SHARE", 0.0)  # as an 8B file would be on this machine
    stored = resolve_model(str(shutil.copy(files["q4_0"], tmp_path / "big-q4_0.gguf")))[1]
    raw = (stored / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"} and (stored / "shipped.safetensors").is_file()
    # the matrices are the file's blocks either way, the embedding rows the same bf16 rounding
    assert torch.equal(_served(stored, prompt), whole)


@pytest.mark.parametrize("kind", ["q4_k", "Q4_K_M"])
async def test_k_quants_are_served_as_transformers_reads_them(files: dict[str, Path], kind: str, tmp_path: Path) -> None:
    """q4_k: random valid blocks (every CI); Q4_K_M: llama.cpp's own `llama-quantize`, where
    ops/harness/llama_cpp.py built it (greedy = transformers' own loading of the file)."""
    from transformers import AutoModelForCausalLM

    if kind not in files:
        made = quantize(files["f16"], tmp_path / f"tiny-{kind}.gguf", kind)
        if made is None:
            pytest.skip("llama-quantize not built here (python -m ops.harness.llama_cpp; CI builds none)")
        files = {**files, kind: made}
    stored = resolve_model(str(files[kind]))[1]  # transformers' dequantization of the file, as stored
    own = AutoModelForCausalLM.from_pretrained(stored, dtype=torch.float32).eval()
    expected = []
    for p in PROMPTS:
        ids = torch.tensor([p])
        expected.append(own.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NUM_NEW, min_new_tokens=NUM_NEW, do_sample=False)[0, len(p) :].tolist())
    got, _ = await greedy_concurrently(files[kind], [Prompt(token_ids=p) for p in PROMPTS], NUM_NEW, 0.0, model_impl="native")
    assert got == expected
    # q4_k: served dense, converted once. Q4_K_M on this model's 128-wide rows is mostly
    # llama-quantize's Q5_0 fallback, Q4_K / Q6_K on ffn_down, Q8_0 on the head and one attn_v
    # (those kept as shipped blocks, as a Q8_0 file's are)
    assert (stored / "shipped.safetensors").exists() is (kind == "Q4_K_M")


def test_a_gguf_of_another_architecture_is_refused_in_one_line(tmp_path: Path) -> None:
    from tests.support.family_assets import llama_cpp_file

    vocab = llama_cpp_file("models/ggml-vocab-bert-bge.gguf")  # a vocabulary file: architecture bert
    error = gguf_error(vocab)
    assert error is not None and "'bert'" in error and "\n" not in error, error
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    assert "not a GGUF" in (gguf_error(junk) or "")
