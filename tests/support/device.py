"""The device the engine tier runs its tiny models on: `SWITCHYARD_TEST_DEVICE`.

Unset (CI, every CPU machine) or `cpu`: the CPU, stated explicitly, so a machine that has a GPU
still runs the suite as CI does. `cuda` or `cuda:N`: the tests that build a runner or an engine
through `suite_device()` (tiny_config, and the runner tests of the model paths) run it there;
ops/gpu/check.sh sets it for tests/engine on a GPU machine. Tests of CPU-only code (quantized
kernels, --compile's one-row graph, the uncaptured bucketed step's traces) pin `device="cpu"`
and stay on the CPU either way. tests/conftest.py refuses a CUDA device torch cannot see.
"""

from __future__ import annotations

import os
from typing import Any

ENV = "SWITCHYARD_TEST_DEVICE"


def suite_device() -> str:
    """The engine tier's device: "cpu" unless SWITCHYARD_TEST_DEVICE names another."""
    value = os.environ.get(ENV, "").strip()
    return value or "cpu"


def on_gpu() -> bool:
    """Whether the suite's runners are on a CUDA device."""
    return suite_device().startswith("cuda")


def kernels_build() -> bool:
    """Whether the row-invariant CPU kernels build here: an x86 CPU and a C compiler (CI's
    machines have both; a GPU machine's image may lack the compiler)."""
    import platform
    import shutil

    return platform.machine() in ("x86_64", "AMD64") and bool(os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc"))


def needs_kernels() -> Any:
    """A skip mark for tests of the row-invariant kernels, where they cannot build."""
    import pytest

    return pytest.mark.skipif(not kernels_build(), reason="no C compiler or not x86: the row-invariant kernels do not build")
