"""What "same request, same answer" holds on the suite's device (the GPU check runs tests/engine
on CUDA), in bf16 with the default drafting (`--spec-decoding auto`).

Where the runner's rows are invariant (the CPU's row-invariant kernels) auto may draft, and
tests/e2e/test_same_answer.py shows the same answer beside other streams and with drafts. On
CUDA no kernel is row-invariant, so what holds there is narrower and checked here: auto drafts
nothing (a verify row's numerics would differ from a decode row's), and on an idle engine the
same greedy or seeded request, repeated with its prefix cached, gives the same tokens and
logprobs (the same step shapes each time). The first run, cold, computes its prompt's last
position in a longer chunk than the warm runs do: equal on invariant rows only, as is an
answer beside other streams (docs/models.md "Same request, same answer").
"""

from __future__ import annotations

from pathlib import Path

from runtime.sampling import SamplingParams
from tests.support.servers import tiny_config
from tests.support.spec import generate, running, tokens
from tests.support.tiny_model import build_tiny_decoder

PROMPT = list(range(5, 45))


async def test_the_same_request_on_an_idle_engine_gets_the_same_answer(tmp_path: Path) -> None:
    model = build_tiny_decoder(tmp_path / "m", "llama", layers=2, hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3)
    config = tiny_config(model, dtype="bfloat16", spec_decoding="auto", max_num_batched_tokens=64)
    async with running(config) as engine:
        rowwise = engine.info.rowwise
        for sampling in (SamplingParams(temperature=0.0, max_tokens=24, logprobs=2, ignore_eos=True), SamplingParams(temperature=1.0, seed=7, max_tokens=24, logprobs=2, ignore_eos=True)):
            runs = [await generate(engine, PROMPT, sampling) for _ in range(3)]
            cold, *warm = [(tokens(r), [lp for d in r for lp in (d.logprobs or [])]) for r in runs]
            assert len(cold[0]) == 24 and warm[0] == warm[1], sampling
            if rowwise:
                assert cold == warm[0], sampling
        stats = engine.statistics()
    if not rowwise:  # no invariant rows: auto must not draft
        assert stats["spec_draft_tokens"] == 0, stats
