"""The torch runner for embedding models (sentence-transformers layout).

Owns: loading an encoder (`AutoModel`) and its pooling recipe from the model directory
(`modules.json`, `1_Pooling/config.json`: mean / cls / max pooling, then Normalize when listed),
and `execute(plan)`: one padded forward over every sequence of the step, pooled and
normalized on the device, `.tolist()` on the executor's thread.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from actors.runners.torch_runner import device_key, pick_device
from runtime.messages import ScheduledSeq, StepPlan, StepResult
from runtime.protocol import ModelInfo
from runtime.sampling import SamplingParams


class EmbeddingRunner:
    def __init__(self, model_dir: Path, *, device: str | None = None, dtype: str | None = None, num_threads: int | None = None) -> None:
        self.model_dir = Path(model_dir)
        self._requested_device = device
        self.device_key = device_key(device)
        # Embeddings default to float32: they are compared by cosine downstream, and bf16
        # moves them by ~1e-3, far past what clients expect from a "direct forward".
        self._dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype or "", torch.float32)
        self._num_threads = num_threads
        self.model: torch.nn.Module | None = None

    def load(self) -> ModelInfo:
        from transformers import AutoModel

        if self._num_threads:
            torch.set_num_threads(self._num_threads)
        self.device = pick_device(self._requested_device)
        self.model = AutoModel.from_pretrained(self.model_dir, dtype=self._dtype).to(self.device).eval()
        self.pooling, self.normalize = pooling_recipe(self.model_dir)
        max_len = sentence_max_length(self.model_dir) or self.model.config.max_position_embeddings
        digest = hashlib.sha256(json.dumps([str(self.model_dir.resolve()), str(self._dtype)]).encode()).hexdigest()[:12]
        return ModelInfo(
            max_model_len=int(max_len),
            vocab_size=int(self.model.config.vocab_size),
            device=str(self.device),
            dtype=str(self._dtype).removeprefix("torch."),
            num_kv_blocks=0,
            block_size=1,
            embedding_size=int(self.model.config.hidden_size),
            fingerprint=f"fp_{digest}",
        )

    def warmup(self) -> None:
        params = SamplingParams(max_tokens=0)
        seqs = tuple(ScheduledSeq(request_id=f"warm-{i}", token_ids=[101, 102][: i + 1], start_pos=0, block_table=[], sample=False, sampling=params, seed=0) for i in range(2))
        self.execute(StepPlan(step_id=-1, seqs=seqs))

    def close(self) -> None:
        self.model = None

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepResult:
        started = time.perf_counter()
        assert self.model is not None
        seqs = plan.seqs
        width = max(len(s.token_ids) for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for row, s in enumerate(seqs):
            ids[row, : len(s.token_ids)] = torch.tensor(s.token_ids, dtype=torch.long)
            mask[row, : len(s.token_ids)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        pooled = pool(hidden, mask, self.pooling)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
        vectors = pooled.tolist()
        return StepResult(
            step_id=plan.step_id,
            sampled={},
            embeddings={s.request_id: v for s, v in zip(seqs, vectors)},
            elapsed=time.perf_counter() - started,
        )


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return hidden.masked_fill(weights == 0, float("-inf")).max(dim=1).values
    summed = (hidden * weights).sum(dim=1)
    counts = weights.sum(dim=1).clamp(min=1e-9)
    if mode == "mean_sqrt_len":
        return summed / counts.sqrt()
    return summed / counts


def pooling_recipe(model_dir: Path) -> tuple[str, bool]:
    """(pooling mode, normalize) from a sentence-transformers directory; mean without one."""
    mode, normalize = "mean", False
    modules_file = model_dir / "modules.json"
    if modules_file.is_file():
        modules = json.loads(modules_file.read_text())
        normalize = any(m.get("type", "").endswith("Normalize") for m in modules)
        for m in modules:
            if m.get("type", "").endswith("Pooling"):
                cfg = json.loads((model_dir / m["path"] / "config.json").read_text())
                if cfg.get("pooling_mode_cls_token"):
                    mode = "cls"
                elif cfg.get("pooling_mode_max_tokens"):
                    mode = "max"
                elif cfg.get("pooling_mode_mean_sqrt_len_tokens"):
                    mode = "mean_sqrt_len"
    return mode, normalize


def sentence_max_length(model_dir: Path) -> int | None:
    cfg = model_dir / "sentence_bert_config.json"
    if cfg.is_file():
        return json.loads(cfg.read_text()).get("max_seq_length")
    return None
