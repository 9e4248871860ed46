"""LoRA adapters on the native forward, each applied to the rows of the requests that named it.

Owns `Adapters`: `--max-loras` slots (0 is the base model: no adapter) of each fused module's A
and B^T, stacked, ranks padded to `--max-lora-rank` (q/k/v as one product: their A stacked,
their B block-diagonal; gate/up likewise; scaling folded into B), filled from PEFT's
safetensors (`read` on any thread, `install`/`remove` on the device thread between steps:
actors/lora_control.py). Once a step `rows(slots)` says which adapter each row has. On the
row-invariant kernels (`kernel`) `add_into` hands the stacks to kernels/lora.c, one call a
module, each row in a fixed order; elsewhere `apply` gathers the rows into an [adapters, most
rows of one] grid and runs two batched products over every adapter at once (as Punica's BGMV
batches them). Requests for several adapters and the base share one step.
"""

from __future__ import annotations

from typing import Any

import torch

from actors.runners.native.kernels import ops
from runtime.adapters import AdapterConfig

# A fused module of a layer → the PEFT projections in it, in the order its output is laid out.
FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",), "gate_up": ("gate_proj", "up_proj"), "down": ("down_proj",)}
_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}

Pair = tuple[torch.Tensor, torch.Tensor]  # A [R, in], B [out, R] (scaled)


class Adapters:
    def __init__(
        self, configs: list[AdapterConfig], out_sizes: dict[str, tuple[int, int]], num_layers: int, dtype: torch.dtype, device: torch.device,
        capacity: int, max_rank: int, kernel: bool = False,
    ) -> None:  # fmt: skip
        """`out_sizes`: each PEFT projection's (input, output) widths in the base model;
        `capacity` adapters (--max-loras) of rank up to `max_rank` held at once, in `dtype`;
        `kernel`: the row-invariant kernels' `lora_add` applies them, else torch's products."""
        self.kernel = kernel
        self.row_slots: torch.Tensor | None = None  # this step's adapter slot of each row, int32 (kernel)
        self.row_order: torch.Tensor | None = None  # its rows with an adapter, grouped by adapter
        self.out_sizes, self.num_layers = out_sizes, num_layers
        self.slots: dict[str, int] = {}  # name → slot, 1..capacity (0: the base)
        self.capacity = max(capacity, len(configs))
        # [layer][fused module] → A [S, R, in], B^T [S, R, out] over the S = capacity slots (slot
        # s at s - 1), R the module's projections times max_rank, zeros where unused: one
        # batched product (or one kernel call) serves every adapter of a step.
        self.stacks = [{module: _empty(module, out_sizes, self.capacity, max_rank, dtype, device) for module in FUSED} for _ in range(num_layers)]
        for config in configs:
            self.install(config.name, read(config, out_sizes, num_layers))
        self.group: tuple[torch.Tensor, torch.Tensor, int] | None = None  # this step's (row per slot place, valid, places)
        self.only: int | None = None  # this step's one adapter, when every row has it

    def add_into(self, y: torch.Tensor, x: torch.Tensor, layer: int, module: str) -> None:
        """`y` += each row's adapter's x A^T B^T, in place, on the row-invariant kernels."""
        if self.row_slots is not None:
            a, b = self.stacks[layer][module]
            ops.lora_add(x, self.row_slots, a, b, y, self.row_order)

    def read(self, config: AdapterConfig) -> list[dict[str, Pair]]:
        """The adapter's weights fitted to this base (any thread): `install` takes them."""
        return read(config, self.out_sizes, self.num_layers)

    def install(self, name: str, layers: list[dict[str, Pair]]) -> None:
        """`read`'s weights into a free slot (on the device thread, between steps); ValueError
        when every slot is taken."""
        free = sorted(set(range(1, self.capacity + 1)) - set(self.slots.values()))
        if not free:
            raise ValueError(f"all {self.capacity} adapter slots (--max-loras) are in use: unload one first")
        self._write(free[0], layers)
        self.slots[name] = free[0]

    def remove(self, name: str) -> None:
        """Free `name`'s slot (its requests have ended: actors/lora_control.py)."""
        self._write(self.slots.pop(name), [{} for _ in range(self.num_layers)])

    def _write(self, slot: int, layers: list[dict[str, Pair]]) -> None:
        for stacks, fused in zip(self.stacks, layers, strict=True):
            for module, (a, b) in stacks.items():
                a[slot - 1].zero_()
                b[slot - 1].zero_()
                if module in fused:
                    pa, pb = fused[module]
                    a[slot - 1, : pa.shape[0], :] = pa
                    b[slot - 1, : pb.shape[1], :] = pb.T

    def rows(self, slots: list[int], device: torch.device) -> None:
        """This step's grouping from its rows' slots: each adapter's rows at its place in a
        [S, most rows of one adapter] grid (padding rows point at row 0 and add nothing)."""
        present = set(slots)
        self.only = next(iter(present)) if len(present) == 1 and 0 not in present else None
        self.group = None
        if self.kernel:
            self.row_slots = None if present == {0} else torch.tensor(slots, dtype=torch.int32)
            self.row_order = None if present == {0} else ops.adapter_order(slots)
            return
        if self.only is not None or present == {0}:
            return
        per_slot: list[list[int]] = [[] for _ in range(self.capacity)]
        for row, slot in enumerate(slots):
            if slot:
                per_slot[slot - 1].append(row)
        places = max(len(rows) for rows in per_slot)
        index = [rows[k] if k < len(rows) else 0 for rows in per_slot for k in range(places)]
        valid = [1.0 if k < len(rows) else 0.0 for rows in per_slot for k in range(places)]
        self.group = (torch.tensor(index, dtype=torch.long, device=device), torch.tensor(valid, device=device)[:, None], places)

    def apply(self, y: torch.Tensor, x: torch.Tensor, layer: int, module: str) -> torch.Tensor:
        """`y` = x W^T of the fused `module` of `layer`, plus each row's adapter's x A^T B^T (zero
        on the base's rows)."""
        a, b = self.stacks[layer][module]
        if self.only is not None:
            return y + (x @ a[self.only - 1].T) @ b[self.only - 1]
        if self.group is None:
            return y
        index, valid, places = self.group
        grouped = x.index_select(0, index).view(a.shape[0], places, -1)  # [S, places, in]
        products = torch.bmm(torch.bmm(grouped, a.transpose(1, 2)), b).view(-1, b.shape[-1]) * valid.to(x.dtype)
        return y.index_add(0, index, products)


def read(config: AdapterConfig, out_sizes: dict[str, tuple[int, int]], num_layers: int) -> list[dict[str, Pair]]:
    """Each layer's fused modules the adapter changes: (A [R, in], B [out, R] scaled), float32,
    read on any thread; ValueError when its weights do not fit the base model."""
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
                fused[module] = _fuse(parts, projections, out_sizes)
        layers.append(fused)
    if raw:
        raise ValueError(f"{config.path}: weights the native forward would not apply: {sorted(raw)[:3]}")
    return layers


def _prefix(raw: dict[str, Any]) -> str:
    """What PEFT writes before `layers.{i}.`: `base_model.model.model.` for a causal LM."""
    name = next(iter(raw), "")
    return name[: name.index("layers.")] if "layers." in name else ""


def _fuse(parts: dict[str, Pair], projections: tuple[str, ...], out_sizes: dict[str, tuple[int, int]]) -> Pair:
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
    return a, b


def _empty(module: str, out_sizes: dict[str, tuple[int, int]], capacity: int, max_rank: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused module's zeroed A [S, R, in] and B^T [S, R, out] for `capacity` adapters."""
    projections = FUSED[module]
    width, out, rank = out_sizes[projections[0]][0], sum(out_sizes[p][1] for p in projections), max_rank * len(projections)
    return torch.zeros(capacity, rank, width, dtype=dtype, device=device), torch.zeros(capacity, rank, out, dtype=dtype, device=device)
