"""`VisionPath`: a vision-language model behind the runner's `ModelPath` interface.

The text tower runs as any transformers model does here (our paged attention, one packed
step of prefill chunks and decodes); what changes is its input: the token embeddings, with the
rows of image placeholder tokens replaced by the vision encoder's output for them.

The encoder runs ahead of the tokens: `encode_ahead`, before each step's forward, works on the
images the plan names (`StepPlan.encode_ahead`: images of admitted requests, whose tokens the
scheduler holds back until their encoder output is here), for as long as the plan's
budget allows, a few of the tower's blocks at a time (slices.py: an image's encoder may span
several steps), and keeps each finished output in the encoder cache by image hash
(`StepResult.images_encoded` tells the scheduler). Then `with_images` finds, for every prompt
chunk in the step, the image tokens it feeds (each image's runs of placeholder positions, from
its `MultiModalPrompt`) and the rows to scatter; an image not in the cache by then (evicted
since) is encoded there and then, whole. All on the device thread, never on the event loop; the
step's encoder seconds go back with its result (`StepResult.encoder_s`), so the step cost fit
learns the forward alone. Positions: plain (LLaVA, Idefics3), or M-RoPE (Qwen2-VL,
Qwen2.5-VL): a prompt position takes its precomputed (time, height, width) triple, a later one
`position + delta` in all three.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import torch

from actors.runners import paged_attention
from actors.runners.request_state import RequestStates
from actors.runners.vision import families
from actors.runners.vision.encoder_cache import EncoderCache
from actors.runners.vision.slices import EncodeJob, Slicer
from runtime.messages import ImageFeatures, ScheduledSeq, StepPlan, StepResult
from runtime.model_store import MROPE_MODEL_TYPES


class VisionPath:
    impl = "transformers+vision"
    takes_images = True

    def __init__(self, model_dir: Path, family: str, dtype: torch.dtype, device: torch.device) -> None:
        paged_attention.register()
        self.family = family
        self.device = device
        self.model = families.load(family, model_dir, dtype, paged_attention.ATTN_NAME).to(device).eval()
        self.text, self.embed, self.lm_head = families.parts(self.model)
        text = self.model.config.get_text_config()
        self.num_layers = text.num_hidden_layers
        self.num_kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        self.head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        self.vocab_size = self.lm_head.weight.shape[0]
        self.max_position_embeddings = getattr(text, "max_position_embeddings", 2048)
        self.mrope = family in MROPE_MODEL_TYPES
        self.encoder_cache = EncoderCache()
        self.slicer = Slicer(families.blocks(family, self.model))
        self._jobs: dict[str, EncodeJob] = {}  # images part-way through the encoder, by hash
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None  # this step's (token indices, features)
        # This step's encoder work, for its StepResult: images now cached, requests whose encoder failed, seconds.
        self._encoded: list[str] = []
        self._failed: dict[str, str] = {}
        self._encoder_s = 0.0

    def encode_ahead(self, plan: StepPlan, requests: RequestStates) -> None:
        """Work on the images of `plan.encode_ahead`, in order, until each is in the encoder
        cache or `plan.encode_budget_s` is spent (an image part-way through goes on in a later
        step). A request whose encoder raises fails alone."""
        self._encoded, self._failed, self._encoder_s = [], {}, 0.0
        if not plan.encode_ahead:
            return
        started = time.perf_counter()
        deadline = None if plan.encode_budget_s is None else started + plan.encode_budget_s
        out_of_time, worked = False, False
        for request_id, key in plan.encode_ahead:
            mm = requests.get(request_id).mm
            image = next(image for image in mm.images if image.hash == key)
            if self.encoder_cache.get(key) is not None:  # encoded for another request, or before a preemption
                self._encoded.append(key)
            elif request_id not in self._failed and not out_of_time:  # the rest waits for a later step
                # A block at least in every step, however small its budget: the encoder moves on.
                out_of_time = worked and deadline is not None and time.perf_counter() >= deadline
                out_of_time = out_of_time or not self._advance(request_id, image, deadline)
                worked = True
        wanted = {key for _, key in plan.encode_ahead}
        for stale in self._jobs.keys() - wanted:  # its requests left part-way through
            del self._jobs[stale]
        self._encoder_s += time.perf_counter() - started

    def _advance(self, request_id: str, image: ImageFeatures, deadline: float | None) -> bool:
        """`image`'s encoder, on from where it stopped, until it is done or out of time (False)."""
        job = self._jobs.get(image.hash)
        if job is None:
            job = self._jobs[image.hash] = EncodeJob(partial(self._encode, image))
        try:
            if not self.slicer.advance(job, deadline):
                return False
        except Exception as exc:
            self._failed[request_id] = f"the vision encoder failed: {type(exc).__name__}: {exc}"
            return True
        finally:
            if job.done or request_id in self._failed:
                del self._jobs[image.hash]
        assert job.result is not None
        self.encoder_cache.put(image.hash, job.result)
        self._encoded.append(image.hash)
        return True

    def report(self, result: StepResult) -> StepResult:
        """`result` with this step's encoder work: the images encoded, the requests whose encoder failed, its seconds."""
        if not (self._encoded or self._failed or self._encoder_s):
            return result
        failed = {**self._failed, **result.failed}
        return msgspec.structs.replace(result, images_encoded=tuple(self._encoded), encoder_s=self._encoder_s, failed=failed)

    def build_step(self, seqs, tables, block_size, k_cache, v_cache):
        return paged_attention.build_step(seqs, tables, block_size, k_cache, v_cache)

    def with_images(self, seqs: tuple[ScheduledSeq, ...], requests: RequestStates, positions: torch.Tensor) -> torch.Tensor:
        """Ready this step's image rows; the positions the text tower takes."""
        dest: list[torch.Tensor] = []
        sources: list[torch.Tensor] = []
        triples: list[torch.Tensor] = []
        cursor = 0
        for seq in seqs:
            start, count = seq.start_pos, len(seq.token_ids)
            mm = requests.get(seq.request_id).mm
            for image in mm.images if mm is not None else ():
                self._image_rows(image, start, start + count, cursor, dest, sources)
            if self.mrope:
                triples.append(self._mrope(mm, start, count))
            cursor += count
        self._rows = (torch.cat(dest).to(self.device), torch.cat(sources)) if dest else None
        return torch.cat(triples, dim=1).to(self.device) if self.mrope else positions

    def _image_rows(self, image: ImageFeatures, start: int, end: int, cursor: int, dest: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
        offset = 0  # the row of the image's output that its run begins at
        for run_start, length in image.runs:
            lo, hi = max(run_start, start), min(run_start + length, end)
            if lo < hi:
                features = self.features(image)
                dest.append(torch.arange(cursor + lo - start, cursor + hi - start))
                sources.append(features[offset + lo - run_start : offset + hi - run_start])
            offset += length

    def features(self, image: ImageFeatures) -> torch.Tensor:
        """The encoder's output for `image`, from the cache or encoded now, whole."""
        found = self.encoder_cache.get(image.hash, count=False)  # a hit when it was asked for ahead
        if found is None:
            started = time.perf_counter()
            found = self._encode(image)
            self.encoder_cache.put(image.hash, found)
            self._encoded.append(image.hash)
            self._encoder_s += time.perf_counter() - started
        return found

    def _encode(self, image: ImageFeatures) -> torch.Tensor:
        found = families.encode(self.family, self.model, image.arrays, self.device)
        if found.shape[0] != image.num_tokens:
            raise ValueError(f"the vision encoder gave {found.shape[0]} rows for an image of {image.num_tokens} tokens")
        return found

    def _mrope(self, mm: Any, start: int, count: int) -> torch.Tensor:
        """`[3, count]` M-RoPE positions of positions start..start+count."""
        table = mm.mrope_positions if mm is not None else None
        if table is None:
            return torch.arange(start, start + count).expand(3, -1)
        length = table.shape[1]
        out = torch.arange(start, start + count).expand(3, -1) + mm.mrope_delta
        if start < length:
            prompt = torch.from_numpy(table[:, start : min(length, start + count)])
            out = torch.cat([prompt, out[:, prompt.shape[1] :]], dim=1)
        return out

    def forward(self, input_ids, positions, step, keep, k_cache, v_cache):
        embeds = self.embed(input_ids)
        if self._rows is not None:
            index, features = self._rows
            embeds[index] = features.to(embeds.dtype)
            self._rows = None
        position_ids = positions[:, None, :] if positions.dim() == 2 else positions[None, :]
        hidden = self.text(inputs_embeds=embeds[None], position_ids=position_ids, use_cache=False, paged_step=step).last_hidden_state[0]
        return self.lm_head(hidden[keep])
