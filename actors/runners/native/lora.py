"""LoRA adapters on the native forward, each applied to the rows of the requests that named it.

Owns `Adapters`: every adapter served (`register`/`forget`, on the device thread between steps:
actors/lora_control.py), its weights read from PEFT's safetensors (`read`, any thread) and kept
in host memory (`--max-cpu-loras`, least recently used out, read again when next wanted), and
`--max-loras` slots (0 is the base model: no adapter) of each fused module's A and B^T, stacked,
ranks padded to `--max-lora-rank` (q/k/v as one product: their A stacked, their B
block-diagonal; gate/up likewise; scaling folded into B). Once a step `rows(names)` gives each
adapter of the step a slot, filling one on first use (the least recently used out), and says
which slot each row has. On the row-invariant kernels (`kernel`) `add_into` hands the stacks to
kernels/lora.c, one call a module, each row in a fixed order; elsewhere `apply` gathers the rows
into an [adapters, most rows of one] grid and runs two batched products over every adapter at
once (as Punica's BGMV batches them), and in the bucketed steps CUDA graphs capture gathers
each row's A and B by index from static buffers (`fix_rows`: shapes fixed, no host sync).
Requests for several adapters and the base share a step.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import torch

from actors.runners.native.kernels import ops
from runtime.adapters import AdapterConfig
from runtime.logging import get_logger

log = get_logger("runner")

# A fused module of a layer → the PEFT projections in it, in the order its output is laid out.
FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",), "gate_up": ("gate_proj", "up_proj"), "down": ("down_proj",)}
_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}

Pair = tuple[torch.Tensor, torch.Tensor]  # A [R, in], B [out, R] (scaled)


class Adapters:
    def __init__(
        self, configs: list[AdapterConfig], out_sizes: dict[str, tuple[int, int]], num_layers: int, dtype: torch.dtype, device: torch.device,
        capacity: int, max_rank: int, kernel: bool = False, host_capacity: int | None = None,
    ) -> None:  # fmt: skip
        """`out_sizes`: each PEFT projection's (input, output) widths in the base model;
        `capacity` adapters (--max-loras) of rank up to `max_rank` in slots at once, in `dtype`,
        `host_capacity` (--max-cpu-loras) read ones in host memory; `kernel`: the row-invariant
        kernels' `lora_add` applies them, else torch's products."""
        self.kernel = kernel
        self.row_slots: torch.Tensor | None = None  # this step's adapter slot of each row, int32 (kernel)
        self.row_order: torch.Tensor | None = None  # its rows with an adapter, grouped by adapter
        self.out_sizes, self.num_layers = out_sizes, num_layers
        # in host memory: every adapter named at start, or --max-cpu-loras; never fewer than the slots
        self.capacity, self.host_capacity = capacity, max(capacity, len(configs) if host_capacity is None else host_capacity)
        self.registered: dict[str, AdapterConfig] = {}  # every adapter served, by name
        self.host: OrderedDict[str, list[dict[str, Pair]]] = OrderedDict()  # read weights, least recently used first
        self.slots: dict[str, int] = {}  # name → slot, 1..capacity (0: the base), filled on first use
        self.last_used: dict[int, int] = {}  # slot → the step that last had it (least recently used out)
        self.steps = self.fills = 0
        self.fill_seconds = 0.0  # filling slots took, lifetime (the first request of an adapter pays it)
        # [layer][fused module] → A [S, R, in], B^T [S, R, out] over the S = capacity slots (slot
        # s at s - 1), R the module's projections times max_rank, zeros where unused: one
        # batched product (or one kernel call) serves every adapter of a step.
        self.stacks = [{module: _empty(module, out_sizes, self.capacity, max_rank, dtype, device) for module in FUSED} for _ in range(num_layers)]
        for config in configs:
            self.register(config, self.read(config))
        self.group: tuple[torch.Tensor, torch.Tensor, int] | None = None  # this step's (row per slot place, valid, places)
        self.only: int | None = None  # this step's one adapter, when every row has it
        # The bucketed steps CUDA graphs capture (native/cuda_graphs.py): each row's stack index
        # and 0/1 weight in static buffers, pad rows as the last real row (`fix_rows`).
        self.fixed: tuple[torch.Tensor, torch.Tensor] | None = None
        self.in_graph = False  # a bucketed step runs: `apply` reads the static buffers

    def add_into(self, y: torch.Tensor, x: torch.Tensor, layer: int, module: str) -> None:
        """`y` += each row's adapter's x A^T B^T, in place, on the row-invariant kernels."""
        if self.row_slots is not None:
            a, b = self.stacks[layer][module]
            ops.lora_add(x, self.row_slots, a, b, y, self.row_order)

    def read(self, config: AdapterConfig) -> list[dict[str, Pair]]:
        """The adapter's weights fitted to this base (any thread): `register` takes them."""
        return read(config, self.out_sizes, self.num_layers)

    def register(self, config: AdapterConfig, layers: list[dict[str, Pair]]) -> None:
        """Serve `config` by its name, `read`'s weights kept in host memory until a slot takes
        them on first use (on the device thread, between steps)."""
        if config.name in self.registered:
            raise ValueError(f"an adapter named {config.name!r} is loaded already")
        self.registered[config.name] = config
        self._keep(config.name, layers)

    def forget(self, name: str) -> None:
        """Serve `name` no more; its slot and host memory are free (its requests have ended:
        actors/lora_control.py)."""
        del self.registered[name]
        self.host.pop(name, None)
        slot = self.slots.pop(name, None)
        if slot is not None:
            self.last_used.pop(slot, None)

    def _keep(self, name: str, layers: list[dict[str, Pair]]) -> None:
        self.host[name] = layers
        self.host.move_to_end(name)
        while len(self.host) > self.host_capacity:
            self.host.popitem(last=False)  # read from its directory again when next wanted

    def _fill(self, name: str, wanted: set[str]) -> int:
        """`name`'s slot, filled now if it has none: a free one, else the least recently used
        of the adapters this step does not want (the scheduler runs at most `capacity`
        adapters at once: actors/adapter_gate.py)."""
        slot = self.slots.get(name)
        if slot is None:
            started = time.perf_counter()
            taken = set(self.slots.values())
            free = [s for s in range(1, self.capacity + 1) if s not in taken]
            idle = sorted((self.last_used.get(s, 0), n) for n, s in self.slots.items() if n not in wanted)
            if not free and not idle:
                raise ValueError(f"a step of {len(wanted)} adapters, over --max-loras {self.capacity}")
            slot = free[0] if free else self.slots.pop(idle[0][1])
            kept = self.host.get(name)
            layers = kept if kept is not None else self.read(self.registered[name])
            self._keep(name, layers)
            self._write(slot, layers)
            self.slots[name] = slot
            self.fills += 1
            self.fill_seconds += (seconds := time.perf_counter() - started)
            log.info("lora_slot_filled", adapter=name, slot=slot, ms=round(1e3 * seconds, 3), from_disk=kept is None)
        self.last_used[slot] = self.steps
        return slot

    def _write(self, slot: int, layers: list[dict[str, Pair]]) -> None:
        for stacks, fused in zip(self.stacks, layers, strict=True):
            for module, (a, b) in stacks.items():
                a[slot - 1].zero_()
                b[slot - 1].zero_()
                if module in fused:
                    pa, pb = fused[module]
                    a[slot - 1, : pa.shape[0], :] = pa
                    b[slot - 1, : pb.shape[1], :] = pb.T

    def fix_rows(self, rows: int, device: torch.device) -> None:
        """Static buffers for bucketed steps of up to `rows` rows (CUDA graphs replay them)."""
        dtype = self.stacks[0]["qkv"][0].dtype
        self.fixed = torch.zeros(rows, dtype=torch.long, device=device), torch.zeros(rows, 1, dtype=dtype, device=device)

    def rows(self, names: list[str | None], device: torch.device) -> None:
        """This step's grouping from its rows' adapters (None: the base), each given a slot:
        each adapter's rows at its place in a [S, most rows of one adapter] grid (padding rows
        point at row 0 and add nothing)."""
        self.steps += 1
        wanted = {name for name in names if name is not None}
        slot_of = {name: self._fill(name, wanted) for name in wanted}
        slots = [0 if name is None else slot_of[name] for name in names]
        if self.fixed is not None and 0 < len(slots) <= self.fixed[0].shape[0]:
            pad = [slots[-1]] * (self.fixed[0].shape[0] - len(slots))  # a pad row repeats the last: the same KV writes
            self.fixed[0].copy_(torch.tensor([max(s - 1, 0) for s in slots + pad]), non_blocking=True)
            self.fixed[1].copy_(torch.tensor([[float(s > 0)] for s in slots + pad]), non_blocking=True)
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
        if self.in_graph and self.fixed is not None:  # static shapes: each row's A and B gathered
            index, weight = self.fixed[0][: x.shape[0]], self.fixed[1][: x.shape[0]]
            low = torch.bmm(a.index_select(0, index), x.unsqueeze(-1)).transpose(1, 2)  # [rows, 1, R]
            return y + torch.bmm(low, b.index_select(0, index)).squeeze(1) * weight
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
