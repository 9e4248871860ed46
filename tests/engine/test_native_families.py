"""The native families as a registry (actors/runners/native/families.py): every way a step runs
(eager, and the bucketed steps CUDA graphs capture, run uncaptured on a CPU) goes through the
family's one forward, `Model.step`; and an architecture added to the table is served by its
family's module with nothing else changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from actors.runners.model_paths import choose
from actors.runners.native import families, llama
from actors.runners.native.config import load_hf_config
from actors.runners.runner_config import RunnerConfig
from actors.runners.torch_runner import TorchRunner

TABLE = list(range(8))


def _greedy(runner: TorchRunner, prompt: list[int], steps: int) -> list[int]:
    assert runner.model is not None
    tokens, ids, start = [], torch.tensor(prompt), 0
    with torch.inference_mode():
        for _ in range(steps):
            step, positions = runner.model.build_step([(start, ids.shape[0])], [TABLE], 4, runner.k_cache, runner.v_cache)
            out = runner.model.forward(ids, positions, step, torch.tensor([ids.shape[0] - 1]), runner.k_cache, runner.v_cache)
            start += ids.shape[0]
            ids = out.argmax(-1)
            tokens.append(int(ids))
    return tokens


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "bucketed"])
def test_every_step_runs_the_familys_one_forward(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, cuda_graphs: bool) -> None:
    runner = TorchRunner(tiny_model_dir, RunnerConfig(device="cpu", dtype="float32", num_kv_blocks=32, block_size=4, num_threads=1, compile=False, cuda_graphs=cuda_graphs))
    runner.load()
    assert runner.model is not None and ("+buckets" in runner.model.impl) is cuda_graphs
    expected = _greedy(runner, [5, 9, 12, 3], 4)
    calls: list[int] = []
    one_forward = llama.LlamaModel.step

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return one_forward(self, *args, **kwargs)

    monkeypatch.setattr(llama.LlamaModel, "step", counted)
    for cache in runner.k_cache + runner.v_cache:
        cache.zero_()
    assert _greedy(runner, [5, 9, 12, 3], 4) == expected and len(calls) == 4
    runner.close()


def test_an_architecture_added_to_the_table_is_served_by_its_familys_module(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    renamed = shutil.copytree(tiny_model_dir, tmp_path / "renamed")
    config = json.loads((renamed / "config.json").read_text())
    config["architectures"] = ["RenamedLlamaForCausalLM"]
    (renamed / "config.json").write_text(json.dumps(config))
    assert "is not one of" in (families.check(load_hf_config(renamed)) or "")
    monkeypatch.setitem(families.ARCHITECTURES, "RenamedLlamaForCausalLM", ("llama", "llama"))
    assert families.check(load_hf_config(renamed)) is None
    path = choose(renamed, RunnerConfig(), torch.float32, torch.device("cpu"))
    assert path.impl.startswith("native")
