"""The runner's device: a CUDA device always carries its index. `TorchRunner.load` calls
`torch.cuda.set_device`, which refuses `torch.device("cuda")` ("Expected a torch.device with a
specified index"), so `--device cuda` and the default on a GPU must resolve to "cuda:N" first.
Checked without a GPU: torch resolves the index in Python before it touches CUDA."""

from __future__ import annotations

import pytest
import torch
from torch.cuda._utils import _get_device_index

from actors.runners.torch_runner import device_key, pick_device


@pytest.mark.parametrize("requested", ["cuda", "auto", None])
def test_a_cuda_device_gets_the_current_index(monkeypatch: pytest.MonkeyPatch, requested: str | None) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    device = pick_device(requested)
    assert device == torch.device("cuda", 0) and device_key(requested) == "cuda:0"
    assert _get_device_index(device) == 0  # what set_device does with it first
    with pytest.raises(ValueError, match="specified index"):
        _get_device_index(torch.device("cuda"))  # and what it did with the bare name


def test_explicit_devices_stay_as_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("cuda:1") == torch.device("cuda", 1)
    assert pick_device("cpu") == pick_device(None) == pick_device("auto") == torch.device("cpu")
