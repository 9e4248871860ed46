"""`Slicer`: the vision encoder run a few of its blocks at a time, between the engine's steps.

Owns: encoding jobs that stop after any block of the vision tower and go on in a later step.
Why: an image's encoder is one long piece of device work (50-70 ms for a 257-patch CLIP on the
2-core CPU, against a ~20 ms decode step); run whole inside one step it is that step's length,
and every stream in the step waits it out. Cut into slices of a few blocks, each step carries
what its time budget allows (the scheduler's grant, from the step cost fit) and the streams'
gaps stay near a decode step.

How: each job runs the family's own encoder call (families.encode: transformers' modules,
unchanged, so the output is exactly the unsliced one) in a greenlet, on the device thread. A
forward hook after every block of the tower switches back to the step when the next block would
run past the slice's deadline; the next `advance` switches in again and the tower goes on from
that block. A greenlet is a second Python stack on the same OS thread, not a thread: torch's
per-thread state (inference mode, the intra-op OpenMP team: runtime/thread_bridge.py says why
a second thread would slow every step) is the device thread's, and each greenlet has its own
contextvars (transformers' output capture keeps its state there). On a GPU a block is launched,
not waited for, so it seems to take no time and a slice is the whole encoder (there it is as
cheap as a step's other work). Imports torch and greenlet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import greenlet
import torch


class EncodeJob:
    """One image's encoder call, started on the first `Slicer.advance` and resumable after any block."""

    def __init__(self, run: Callable[[], torch.Tensor]) -> None:
        self._greenlet = greenlet.greenlet(run)
        self.result: torch.Tensor | None = None

    @property
    def done(self) -> bool:
        return self.result is not None


class Slicer:
    def __init__(self, blocks: torch.nn.ModuleList) -> None:
        self._deadline: float | None = None  # of the slice running now; None: no job runs, no block stops
        self._step: Any = None  # the greenlet that called advance: where a block hands back to
        self._mark = 0.0  # when the last block (or the slice) began
        self._block_s = 0.0  # how long the last block took: the next is taken to take as long
        for block in blocks:
            block.register_forward_hook(self._after_block)

    def advance(self, job: EncodeJob, deadline: float | None) -> bool:
        """Run `job` until it is done (True) or its next block would end past `deadline` (a
        `time.perf_counter()` value; None: run to the end). At least one block runs."""
        self._deadline, self._step, self._mark = deadline, greenlet.getcurrent(), time.perf_counter()
        try:
            out = job._greenlet.switch()
        finally:
            self._deadline, self._step = None, None
        if job._greenlet.dead:
            job.result = out
        return job.done

    def _after_block(self, module: Any, args: Any, output: Any) -> None:
        if self._deadline is None or greenlet.getcurrent() is self._step:
            return  # a block run outside a job (an image encoded inline): no stop
        now = time.perf_counter()
        self._block_s, self._mark = now - self._mark, now
        if now + self._block_s > self._deadline:
            self._step.switch()  # back to the step; the next advance resumes here
            self._mark = time.perf_counter()
