"""`VisionPath`: a vision-language model behind the runner's `ModelPath` interface.

The text tower runs as any transformers model does here (our paged attention, one packed
step of prefill chunks and decodes); what changes is its input: the token embeddings, with the
rows of image placeholder tokens replaced by the vision encoder's output for them. Before each
forward, `with_images` finds, for every prompt chunk in the step, the image tokens it feeds
(each image's runs of placeholder positions, from its `MultiModalPrompt`), encodes the images
the encoder cache does not hold (once per image: a chunk boundary inside an image, a
preemption or another request with the same image read the cached output) and keeps the rows
to scatter. The encoder runs here, on the device thread, inside the step that first feeds the
image's tokens: part of that request's prefill, never on the event loop. Positions: plain
(LLaVA, Idefics3), or M-RoPE (Qwen2-VL, Qwen2.5-VL): a prompt position takes its precomputed (time, height, width)
triple, a later one `position + delta` in all three.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from actors.runners import paged_attention
from actors.runners.request_state import RequestStates
from actors.runners.vision import families
from actors.runners.vision.encoder_cache import EncoderCache
from runtime.messages import ImageFeatures, ScheduledSeq
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
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None  # this step's (token indices, features)

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
        """The encoder's output for `image`, from the cache or encoded now."""
        found = self.encoder_cache.get(image.hash)
        if found is None:
            found = families.encode(self.family, self.model, image.arrays, self.device)
            if found.shape[0] != image.num_tokens:
                raise ValueError(f"the vision encoder gave {found.shape[0]} rows for an image of {image.num_tokens} tokens")
            self.encoder_cache.put(image.hash, found)
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
