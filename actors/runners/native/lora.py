"""LoRA adapters on the native forward, each applied to the rows of the requests that named it.

Owns `Adapters`: every adapter named at start (runtime/adapters.py read its config) loaded from
PEFT's safetensors into a slot (0 is the base model: no adapter), each projection's A and B
(scaling folded into B) fused as the family fuses its weights: q/k/v as one product (their A
stacked, their B block-diagonal), gate/up likewise, so a layer adds at most four low-rank
products. `rows(slots)` cuts a step's per-row slots into (slot, rows) segments once a step;
`apply` adds each segment's (x A^T) B^T to the rows of that adapter only, one grouped product
per adapter in the step, as Punica's segmented GEMM groups them. Requests for several adapters
and the base share one step.
"""

from __future__ import annotations

from typing import Any

import torch

from runtime.adapters import AdapterConfig

# A fused module of a layer → the PEFT projections in it, in the order its output is laid out.
FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",), "gate_up": ("gate_proj", "up_proj"), "down": ("down_proj",)}
_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}

Pair = tuple[torch.Tensor, torch.Tensor]  # A [R, in], B [out, R] (scaled)


class Adapters:
    def __init__(self, configs: list[AdapterConfig], out_sizes: dict[str, tuple[int, int]], num_layers: int, dtype: torch.dtype, device: torch.device) -> None:
        """`out_sizes`: each PEFT projection's (input, output) widths in the base model."""
        self.slots = {config.name: slot for slot, config in enumerate(configs, start=1)}
        # [slot][layer][fused module] → (A, B); slot 0 (the base) has none.
        self.weights: list[list[dict[str, Pair]]] = [[{} for _ in range(num_layers)]]
        for config in configs:
            self.weights.append(_load(config, out_sizes, num_layers, dtype, device))
        self.segments: list[tuple[int, torch.Tensor | None]] = []

    def rows(self, slots: list[int], device: torch.device) -> None:
        """This step's segments from its rows' slots: (slot, row indices, or None for all rows)."""
        present = sorted(set(slots) - {0})
        if len(present) == 1 and 0 not in slots:
            self.segments = [(present[0], None)]
            return
        self.segments = [(slot, torch.tensor([i for i, s in enumerate(slots) if s == slot], dtype=torch.long, device=device)) for slot in present]

    def apply(self, y: torch.Tensor, x: torch.Tensor, layer: int, module: str) -> torch.Tensor:
        """`y` = x W^T of the fused `module` of `layer`, plus each row's adapter's x A^T B^T."""
        for slot, index in self.segments:
            pair = self.weights[slot][layer].get(module)
            if pair is None:
                continue
            a, b = pair
            if index is None:
                y = y + (x @ a.T) @ b.T
            else:
                y = y.index_add(0, index, (x.index_select(0, index) @ a.T) @ b.T)
        return y


def _load(config: AdapterConfig, out_sizes: dict[str, tuple[int, int]], num_layers: int, dtype: torch.dtype, device: torch.device) -> list[dict[str, Pair]]:
    from safetensors.torch import load_file

    from runtime.adapters import WEIGHTS

    raw = load_file(str(config.path / WEIGHTS))
    prefix = _prefix(raw)
    layers: list[dict[str, Pair]] = []
    for i in range(num_layers):
        fused: dict[str, Pair] = {}
        for module, projections in FUSED.items():
            parts = {}
            for name in projections:
                a = raw.pop(f"{prefix}layers.{i}.{_PARENT[name]}.{name}.lora_A.weight", None)
                b = raw.pop(f"{prefix}layers.{i}.{_PARENT[name]}.{name}.lora_B.weight", None)
                if (a is None) != (b is None):
                    raise ValueError(f"{config.path}: layer {i} {name}: lora_A and lora_B not both present")
                if a is not None and b is not None:
                    parts[name] = (a.float(), b.float() * config.scaling)
            if parts:
                fused[module] = _fuse(parts, projections, out_sizes, dtype, device)
        layers.append(fused)
    if raw:
        raise ValueError(f"{config.path}: weights the native forward would not apply: {sorted(raw)[:3]}")
    return layers


def _prefix(raw: dict[str, Any]) -> str:
    """What PEFT writes before `layers.{i}.`: `base_model.model.model.` for a causal LM."""
    name = next(iter(raw), "")
    return name[: name.index("layers.")] if "layers." in name else ""


def _fuse(parts: dict[str, Pair], projections: tuple[str, ...], out_sizes: dict[str, tuple[int, int]], dtype: torch.dtype, device: torch.device) -> Pair:
    """One (A, B) for a fused module: the projections' A stacked, their B block-diagonal over
    the fused output (zeros for a projection the adapter leaves alone)."""
    a = torch.cat([parts[p][0] for p in projections if p in parts])
    b = torch.zeros(sum(out_sizes[p][1] for p in projections), a.shape[0])
    row = col = 0
    for p in projections:
        if p in parts:
            block = parts[p][1]
            if block.shape[0] != out_sizes[p][1] or parts[p][0].shape[1] != out_sizes[p][0]:
                raise ValueError(f"{p}: lora_B {tuple(block.shape)} / lora_A {tuple(parts[p][0].shape)} do not fit the base model's projection")
            b[row : row + block.shape[0], col : col + block.shape[1]] = block
            col += block.shape[1]
        row += out_sizes[p][1]
    return a.to(device=device, dtype=dtype).contiguous(), b.to(device=device, dtype=dtype).contiguous()
