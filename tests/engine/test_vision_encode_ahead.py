"""The vision encoder run ahead of an image's tokens, in slices between steps
(actors/runners/vision/slices.py, path.py `encode_ahead`; the scheduler's side: actors/encode_ahead.py).

Each family's encoder stopped after every block of its tower gives exactly the output of one
whole call (the greenlet runs transformers' own modules, unchanged); an encoder that raises
fails its request alone; and on the engine, images encoded over several steps beside a streaming
request (the step's spare time a block's worth: `step_stretch` 1.01) leave the greedy output
token-identical to transformers' `generate`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import trio

from actors.build import build_engine
from actors.multimodal import ImagePrompts, load_processor
from actors.runners.request_state import RequestStates
from actors.runners.vision import families
from actors.runners.vision.path import VisionPath
from actors.runners.vision.slices import Slicer
from runtime.messages import NewRequest, StepPlan, StepResult
from runtime.model_store import VISION_MODEL_TYPES
from runtime.request import Prompt
from runtime.sampling import SamplingParams
from tests.support.device import suite_device
from tests.support.servers import tiny_config
from tests.support.tiny_vlm import VISION_CASES as CASES
from tests.support.tiny_vlm import case, reference_generate

NUM_NEW = 12


def _introduce(path: VisionPath, family: str, model_dir: Path, requests: RequestStates, request_id: str, seeds: list[int]) -> Any:
    messages, images, _ = case("Compare these.", seeds)
    ids, mm = ImagePrompts(load_processor(model_dir, family), family).encode(Prompt(messages=messages, images=tuple(images)))
    requests.apply(StepPlan(step_id=0, seqs=(), new_requests=(NewRequest(request_id=request_id, prompt_token_ids=tuple(ids), mm=mm),)))
    return mm


@pytest.mark.parametrize("family", VISION_MODEL_TYPES)
def test_an_encoder_stopped_after_every_block_gives_the_whole_output(family: str, request: pytest.FixtureRequest) -> None:
    model_dir: Path = request.getfixturevalue(f"{family}_dir")
    path = VisionPath(model_dir, family, torch.float32, torch.device(suite_device()))
    requests = RequestStates()
    mm = _introduce(path, family, model_dir, requests, "r", [2, 3])
    encode = tuple(("r", image.hash) for image in mm.images)
    reported: list[str] = []
    steps = 0
    with torch.inference_mode():
        whole = [families.encode(family, path.model, image.arrays, path.device) for image in mm.images]
        while len(reported) < len(mm.images):
            steps += 1
            assert steps < 50
            path.encode_ahead(StepPlan(step_id=steps, seqs=(), encode_ahead=encode, encode_budget_s=0.0), requests)
            result = path.report(StepResult(step_id=steps, sampled={}))
            assert not result.failed and result.encoder_s > 0
            reported += [key for key in result.images_encoded if key not in reported]
    blocks = len(families.blocks(family, path.model))
    assert steps >= len(mm.images) * blocks  # a block a step at the least
    for image, expected in zip(mm.images, whole):
        assert torch.equal(path.encoder_cache.get(image.hash), expected)
    assert path.encoder_cache.statistics()["images_encoded"] == len(mm.images) and not path._jobs


def test_an_encoder_that_raises_fails_its_request_alone(llava_dir: Path) -> None:
    path = VisionPath(llava_dir, "llava", torch.float32, torch.device(suite_device()))
    requests = RequestStates()
    good = _introduce(path, "llava", llava_dir, requests, "good", [2])
    bad = _introduce(path, "llava", llava_dir, requests, "bad", [3])
    broken = bad.images[0].arrays["pixel_values"][:, :1]  # one channel: the tower's first conv refuses it
    bad.images[0].arrays["pixel_values"] = broken
    plan = StepPlan(step_id=1, seqs=(), encode_ahead=(("bad", bad.images[0].hash), ("good", good.images[0].hash)))
    with torch.inference_mode():
        path.encode_ahead(plan, requests)
    result = path.report(StepResult(step_id=1, sampled={}))
    assert list(result.failed) == ["bad"] and "the vision encoder failed" in result.failed["bad"]
    assert result.images_encoded == (good.images[0].hash,) and not path._jobs


@pytest.mark.parametrize("fixture", ["llava_dir", "qwen2_5_vl_dir"])
async def test_images_encoded_in_slices_beside_a_stream_match_transformers(fixture: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir: Path = request.getfixturevalue(fixture)
    advances: dict[int, list[float | None]] = {}  # per encoder job: the deadline of each slice
    jobs: list[Any] = []  # kept alive: a finished job's id() would be reused by the next one
    advance = Slicer.advance

    def counted(self: Slicer, job: Any, deadline: float | None) -> bool:
        if all(seen is not job for seen in jobs):
            jobs.append(job)
        advances.setdefault(id(job), []).append(deadline)
        return advance(self, job, deadline)

    monkeypatch.setattr(Slicer, "advance", counted)
    cases = [CASES[0], CASES[1], CASES[4]]
    expected = [reference_generate(model_dir, *case(text, seeds)[::2], NUM_NEW) for text, seeds in cases]
    # A step's spare time: a block's worth of encoder. Drafting off, on a guess: the test failed
    # once on 2026-11-27 in a run beside tests/unit, its message not kept (alone and with both
    # cores loaded it passed 10 of 10), and kept drafts would shorten the stream the slices need
    # beside them. This test is about the slices; the other test_vision_*.py run drafting's default.
    runtime = build_engine(tiny_config(model_dir, step_stretch=1.01, spec_decoding="off"))
    got: list[list[int]] = [[] for _ in cases]
    streaming = trio.Event()

    async def stream() -> None:  # a text stream the images come beside, until they are done
        text = Prompt(messages=case("def add(a, b): return a + b", [])[0])
        async with runtime.submit(text, SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)) as deltas:
            async for _ in deltas:
                streaming.set()

    async def one(i: int) -> None:
        messages, images, _ = case(*cases[i])
        async with runtime.submit(Prompt(messages=messages, images=tuple(images)), SamplingParams(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True)) as deltas:
            async for delta in deltas:
                got[i] += delta.token_ids

    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.run)
        nursery.start_soon(stream)
        await streaming.wait()
        async with trio.open_nursery() as images:
            for i in range(len(cases)):
                images.start_soon(one, i)
        nursery.cancel_scope.cancel()
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"case {i} {cases[i]} diverged"
    sliced = [deadlines for deadlines in advances.values() if len(deadlines) > 1 and None not in deadlines]
    assert len(sliced) == 4, advances  # every image encoded over several steps, beside the stream
