"""How fast does this card move memory? The copy bandwidth the decode bound divides by.

    python -m ops.gpu.bandwidth [--device cuda] [--mib 1024] [--reps 20] [--out bandwidth.json]

A device-to-device copy of one buffer into another (`Tensor.copy_`), timed with CUDA events
after warm-up copies; the bandwidth counts the bytes read and the bytes written (2 x the buffer
per copy), which is how HBM's traffic adds up and how KINDS.md reports it (about 3.0 TB/s on
an H100, 4.3 on an H200). The best of three timed rounds. A decode step that reads W bytes of
weights then takes at least W / bandwidth: ops/gpu/report.py divides by it. On a CPU (the dry
run) the same copy in host memory, timed with the wall clock.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def copy_bandwidth(device: str, mib: int, reps: int, rounds: int = 3) -> dict[str, Any]:
    """GB/s (10^9 bytes) of `reps` copies of a `mib` MiB buffer, the best of `rounds`."""
    import torch

    nbytes = mib * 2**20
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    cuda = src.is_cuda
    for _ in range(3):
        dst.copy_(src)
    seconds = []
    for _ in range(rounds):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                dst.copy_(src)
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1000)
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                dst.copy_(src)
            seconds.append(time.perf_counter() - t0)
    best = min(seconds)
    return {
        "device": device, "gpu": torch.cuda.get_device_name(src.device) if cuda else None, "buffer_mib": mib, "copies": reps,
        "counted": "bytes read + bytes written", "gb_s": round(2 * nbytes * reps / best / 1e9, 1), "rounds_s": [round(s, 5) for s in seconds],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--mib", type=int, default=1024, help="buffer size in MiB (two of them are allocated)")
    p.add_argument("--reps", type=int, default=20, help="copies per timed round")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    result = copy_bandwidth(args.device, args.mib, args.reps)
    print(f"bandwidth: {result['gb_s']} GB/s on {result['gpu'] or args.device} ({args.mib} MiB copied {args.reps}x, read + write counted)")
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
