"""The messages between the front end and an engine process: plain data both ways (no pickling),
whole however the byte stream is cut."""

from __future__ import annotations

from runtime.engine_wire import Abort, Failed, Frames, Ready, Step, Stop, Submit, ToEngine, ToFront, frame
from runtime.messages import AbortReason, FinishReason, Logprob, RegisterRequest, StepOutputs, TokenDelta, TokenizedRequest
from runtime.protocol import ModelInfo
from runtime.sampling import Guide, SamplingParams


def test_every_message_crosses_whole_however_the_stream_is_cut() -> None:
    sampling = SamplingParams(max_tokens=8, temperature=0.5, guide=Guide(kind="json_schema", definition='{"type": "object"}', param="response_format"))
    request = TokenizedRequest(request_id="r1", prompt_token_ids=[1, 2, 3], sampling=sampling, max_tokens=8, seed=7, arrival_time=12.5)
    register = RegisterRequest(request_id="r1", mailbox=None, sampling=sampling, arrival_time=12.5, scheduled_time=13.0, num_prompt_tokens=3, num_cached_tokens=0, num_truncated_tokens=0)
    delta = TokenDelta(request_id="r1", token_ids=[5], finish_reason=FinishReason.LENGTH, logprobs=[Logprob(5, -0.25, [(5, -0.25), (9, -1.5)])], register=register)
    to_engine = [Submit([request]), Abort("r1", AbortReason.CLIENT_GONE), Stop()]
    info = ModelInfo(max_model_len=512, vocab_size=400, device="cpu", dtype="float32", num_kv_blocks=64, block_size=16, fingerprint="fp_x", impl="native")
    to_front = [Ready(info=info), Step(outputs=StepOutputs(step_id=3, items=[delta]), dropped=["r0"], steps=[(64, 0.002, False)], counters={"running": 1}), Failed("boom")]
    for messages, kind in ((to_engine, ToEngine), (to_front, ToFront)):
        stream = b"".join(frame(m) for m in messages)
        for cut in (1, 3, 7, len(stream)):
            frames = Frames(kind)
            got = [m for i in range(0, len(stream), cut) for m in frames.feed(stream[i : i + cut])]
            assert got == messages


def test_a_vision_requests_arrays_cross_as_they_were() -> None:
    """Images' processor arrays and M-RoPE positions (numpy) cross as msgpack extension values:
    the same dtype, shape and values, writable (torch.from_numpy takes them)."""
    import numpy as np

    from runtime.messages import ImageFeatures, MultiModalPrompt

    pixels = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)[:, ::2]  # not contiguous
    grid, positions = np.array([[1, 4, 4]], dtype=np.int64), np.zeros((3, 9), dtype=np.int64)
    image = ImageFeatures(hash="h", runs=((2, 4),), arrays={"pixel_values": pixels, "image_grid_thw": grid})
    request = TokenizedRequest(request_id="r", prompt_token_ids=[1] * 9, sampling=SamplingParams(), max_tokens=4, seed=1, arrival_time=0.0,
                               mm=MultiModalPrompt(images=(image,), mrope_positions=positions, mrope_delta=-3))  # fmt: skip
    (got,) = Frames(ToEngine).feed(frame(Submit([request])))
    crossed = got.requests[0].mm
    assert crossed.mrope_delta == -3 and crossed.images[0].runs == ((2, 4),)
    for sent, came in ((pixels, crossed.images[0].arrays["pixel_values"]), (grid, crossed.images[0].arrays["image_grid_thw"]), (positions, crossed.mrope_positions)):
        assert came.dtype == sent.dtype and came.shape == sent.shape and (came == sent).all() and came.flags.writeable
