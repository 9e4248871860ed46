"""The vision bench's LLaVA with the embedded SmolLM2-135M as its text tower (slow, real weights).

ops/harness/tiny_vlm.py `build_llava(text_weights=True)` copies the default model's weights into
the LLaVA's language model (the `<image>` token's new embedding row random): on a text prompt
its logits are SmolLM2's own, so the bench's text streams are that model's text and its steps
that model's cost (ops/bench/vision.py, `--text-tower smollm2`, the default).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlavaForConditionalGeneration

from ops.harness.prompts import default_model_dir
from ops.harness.tiny_vlm import build_llava

pytestmark = pytest.mark.slow


def test_the_llava_text_tower_is_the_default_model(tmp_path: Path) -> None:
    source = default_model_dir()
    llava_dir = build_llava(tmp_path / "llava", source, text_weights=True)
    ids = torch.tensor([AutoTokenizer.from_pretrained(source).encode("The capital of France is")])
    with torch.inference_mode():
        want = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()(ids).logits
        got = LlavaForConditionalGeneration.from_pretrained(llava_dir, dtype=torch.float32).eval()(input_ids=ids).logits
    vocab = want.shape[-1]
    assert got.shape[-1] == vocab + 1  # and `<image>`
    torch.testing.assert_close(got[..., :vocab], want, rtol=1e-4, atol=1e-4)
