"""Images encoded ahead of their tokens (actors/encode_ahead.py) in the scheduler core.

The core is driven on a simulated clock, as in test_step_budget.py: a step "takes" what a linear
cost says its forward takes plus the encoder work the simulated runner did in it. The runner
encodes an image in blocks of `BLOCK_S` (an image is `BLOCKS` of them), as many as the plan's
`encode_budget_s` allows and at least one, and reports the image once its last block ran. Four
text streams decode while image requests arrive: no image token is fed before its image was
reported, no step runs past the stretch by more than one block, and alone an image is encoded
whole in one step.
"""

from __future__ import annotations

from collections import defaultdict

from runtime.messages import ImageFeatures, MultiModalPrompt, StepPlan, StepResult, TokenizedRequest
from runtime.sampling import SamplingParams
from tests.support.sched_driver import Driver, make_core, prompt_of

BASE, PER_ROW, PER_TOKEN = 0.010, 0.002, 0.0003
BLOCK_S, BLOCKS = 0.009, 7  # an image's encoder: 63 ms, against a 20 ms step of 5 decodes
STRETCH = 1.7
IMAGE_AT, IMAGE_TOKENS = 6, 64


def forward_s(decode_rows: int, prefill_tokens: int) -> float:
    return BASE + PER_ROW * decode_rows + PER_TOKEN * prefill_tokens


CALIBRATION = tuple((r, t, forward_s(r, t)) for r, t in [(1, 0), (32, 0), (0, 256), (1, 256), (32, 128)])


class EncodingDriver(Driver):
    """The Driver, with a runner that encodes images in blocks and reports them."""

    def __init__(self, **overrides: object) -> None:
        super().__init__(make_core(num_blocks=256, max_num_batched_tokens=128, step_stretch=STRETCH, step_samples=CALIBRATION, **overrides))
        self.blocks_done: dict[str, int] = defaultdict(int)  # image hash -> encoder blocks run
        self.images: dict[str, str] = {}  # request id -> its image's hash
        self.fed_before_encoded: list[str] = []
        self.step_times: list[tuple[StepPlan, float, float]] = []  # (plan, seconds, encoder seconds)

    def add_image_request(self, request_id: str, image: str, max_tokens: int = 4) -> None:
        prompt = prompt_of(IMAGE_AT + IMAGE_TOKENS + 4)
        mm = MultiModalPrompt(images=(ImageFeatures(hash=image, runs=((IMAGE_AT, IMAGE_TOKENS),)),))
        self.core.add(
            TokenizedRequest(request_id=request_id, prompt_token_ids=prompt, sampling=SamplingParams(), max_tokens=max_tokens, seed=0, arrival_time=0.0, mm=mm)
        )
        self.prompts[request_id] = prompt
        self.images[request_id] = image

    def step_clocked(self, now: float) -> float:
        plan = self.schedule()
        assert plan is not None
        encoder_s, encoded = 0.0, []
        for _, image in plan.encode_ahead:
            if self.blocks_done[image] >= BLOCKS:
                encoded.append(image)
                continue
            while self.blocks_done[image] < BLOCKS and (
                plan.encode_budget_s is None or encoder_s == 0.0 or encoder_s + BLOCK_S <= plan.encode_budget_s
            ):
                self.blocks_done[image] += 1
                encoder_s += BLOCK_S
            if self.blocks_done[image] < BLOCKS:
                break
            encoded.append(image)
        for s in plan.seqs:
            image = self.images.get(s.request_id)
            if image is not None and s.start_pos + len(s.token_ids) > IMAGE_AT and s.start_pos < IMAGE_AT + IMAGE_TOKENS and self.blocks_done[image] < BLOCKS:
                self.fed_before_encoded.append(s.request_id)
        seconds = forward_s(plan.num_decode_rows, plan.num_prefill_tokens) + encoder_s
        result = self.result(plan)
        self.update(plan, StepResult(step_id=result.step_id, sampled=result.sampled, images_encoded=tuple(encoded), encoder_s=encoder_s), now, now + seconds)
        self.step_times.append((plan, seconds, encoder_s))
        return now + seconds


def test_an_image_is_encoded_in_slices_beside_streams_and_its_tokens_wait_for_it() -> None:
    d = EncodingDriver()
    for i in range(4):
        d.add(f"text-{i}", prompt_of(24, start=10 + i), max_tokens=200)
    now = 0.0
    for _ in range(10):  # the streams are decoding
        now = d.step_clocked(now)
    for i in range(3):
        d.add_image_request(f"image-{i}", f"a{i}")
        d.add(f"late-{i}", prompt_of(40, start=200 + 50 * i), max_tokens=4)  # a prompt beside the encoder
        for _ in range(40):
            now = d.step_clocked(now)
    assert not d.fed_before_encoded
    assert all(f"image-{i}" in d.finished for i in range(3)), d.core.statistics()
    encoding = [(plan, seconds, enc) for plan, seconds, enc in d.step_times if plan.encode_ahead]
    # Each image took several steps of encoder work (one block or two a step), within the stretch,
    # and prompts went on beside it (half the spare time theirs: more than a block of tokens).
    assert len([e for _, _, e in encoding if e]) >= 3 * BLOCKS // 2
    assert any(plan.num_prefill_tokens > d.core.config.block_size for plan, _, _ in encoding)
    for plan, seconds, encoder_s in encoding:
        assert plan.encode_budget_s is not None
        decode_alone = forward_s(plan.num_decode_rows, 0)
        assert encoder_s <= max(BLOCK_S, plan.encode_budget_s), (plan, encoder_s)
        assert seconds <= STRETCH * forward_s(len(d.core.running) + 1, 0) + BLOCK_S, (plan.num_decode_rows, plan.num_prefill_tokens, seconds, decode_alone)
    # The streams never waited a whole encoder (63 ms) between two tokens.
    assert max(seconds for _, seconds, _ in d.step_times[10:]) < BLOCKS * BLOCK_S


def test_alone_an_image_is_encoded_whole_and_its_tokens_follow() -> None:
    d = EncodingDriver()
    d.add_image_request("image", "ab")
    now = d.step_clocked(0.0)
    first = d.step_times[0][0]
    # Nobody streams: no limit on the encoder; the text before the image rides along, the image waits.
    assert first.encode_ahead == (("image", "ab"),) and first.encode_budget_s is None
    assert [(s.start_pos, len(s.token_ids)) for s in first.seqs] == [(0, IMAGE_AT)]
    assert d.step_times[0][2] == BLOCKS * BLOCK_S
    while d.core.has_work:
        now = d.step_clocked(now)
    assert "image" in d.finished and not d.fed_before_encoded
    assert not any(p.encode_ahead for p, _, _ in d.step_times[1:])  # reported once, never asked again


def test_an_image_first_in_its_prompt_is_admitted_to_be_encoded() -> None:
    """A request with nothing to feed before its image is admitted with no tokens, introduced
    to the runner (which needs its images), encoded, then fed: it does not block the queue."""
    d = EncodingDriver()
    prompt = prompt_of(IMAGE_TOKENS + 4)
    mm = MultiModalPrompt(images=(ImageFeatures(hash="ac", runs=((0, IMAGE_TOKENS),)),))
    d.core.add(TokenizedRequest(request_id="first", prompt_token_ids=prompt, sampling=SamplingParams(), max_tokens=2, seed=0, arrival_time=0.0, mm=mm))
    d.prompts["first"], d.images["first"] = prompt, "ac"
    d.add("text", prompt_of(8), max_tokens=2)
    plan = d.core.schedule()
    assert plan is not None and plan.encode_ahead == (("first", "ac"),)
    assert [s.request_id for s in plan.seqs] == ["text"]  # admitted behind it
    assert [r.request_id for r in plan.new_requests] == ["first", "text"]
    d.blocks_done["ac"] = BLOCKS
    d.update(plan, StepResult(step_id=plan.step_id, sampled=d.result(plan).sampled, images_encoded=("ac",)))
    now = 0.0
    for _ in range(10):
        if not d.core.has_work:
            break
        now = d.step_clocked(now)
    assert "first" in d.finished and not d.fed_before_encoded


def test_a_failed_encoder_fails_its_request_alone() -> None:
    d = EncodingDriver()
    d.add("text", prompt_of(8), max_tokens=50)
    d.add_image_request("image", "ab")
    plan = d.schedule()
    assert plan is not None and plan.encode_ahead == (("image", "ab"),)
    result = d.result(plan)
    deltas = d.update(plan, StepResult(step_id=plan.step_id, sampled=result.sampled, failed={"image": "the vision encoder failed: boom"}))
    assert [(x.request_id, x.error) for x in deltas if x.error] == [("image", "the vision encoder failed: boom")]
    assert "image" not in d.core.requests and "text" in d.core.requests
    plan = d.schedule()
    assert plan is not None and not plan.encode_ahead


def test_an_image_admitted_behind_a_text_prompt_is_still_encoded_in_slices() -> None:
    d = EncodingDriver()
    d.add("stream", prompt_of(8), max_tokens=200)
    now = 0.0
    for _ in range(5):
        now = d.step_clocked(now)
    d.add("text", prompt_of(8, start=50), max_tokens=50)  # the head of the queue: no image
    d.add_image_request("image", "ad")
    now = d.step_clocked(now)
    plan, _, encoder_s = d.step_times[-1]
    assert "text" in {s.request_id for s in plan.seqs} and plan.encode_ahead == (("image", "ad"),)
    assert plan.encode_budget_s is not None and encoder_s < BLOCKS * BLOCK_S
