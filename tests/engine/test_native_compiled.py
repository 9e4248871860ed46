"""The compiled native path (`--compile`): the eager step serves at once, the one-row decode
graph is compiled on a thread of its own and swapped in; then no step compiles again.

Prefill chunks beside decodes and decode at several batch sizes run eager; a single sequence
decoding alone runs the graph as its context grows. None of it may compile (torch._dynamo's
error_on_recompile turns any recompile into an error), and all of it must give the eager
path's greedy tokens. On the CPU whatever SWITCHYARD_TEST_DEVICE says: on CUDA the
decode steps are CUDA graphs and --compile stands aside.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from actors.runners.runner_config import RunnerConfig
from actors.runners.torch_runner import TorchRunner
from runtime.messages import NewRequest, ScheduledSeq, StepPlan
from runtime.sampling import SamplingParams
from tests.support import ROOT

GREEDY = SamplingParams(temperature=0.0, max_tokens=64)


def _run(runner: TorchRunner) -> list[dict[str, int]]:
    """Prompts of 5 and 9 tokens, a one-token prompt joining later, 12 steps; then "a" alone."""
    tables = {"a": list(range(0, 8)), "b": list(range(8, 16)), "c": list(range(16, 24))}
    prompts = {"a": [5, 6, 7, 8, 9], "b": list(range(20, 29)), "c": [40]}
    history: dict[str, list[int]] = {k: list(v) for k, v in prompts.items()}
    out = []
    for step in range(18):
        seqs, new = [], []
        for rid in ("a",) if step >= 12 else ("a", "b", "c") if step >= 3 else ("a", "b"):
            fresh = len(history[rid]) == len(prompts[rid])
            tokens = history[rid] if fresh else history[rid][-1:]
            start = 0 if fresh else len(history[rid]) - 1
            seqs.append(ScheduledSeq(request_id=rid, token_ids=list(tokens), start_pos=start, block_table=tables[rid], sample=True, sampling=GREEDY, seed=0))
            if fresh:
                new.append(NewRequest(request_id=rid, prompt_token_ids=tuple(prompts[rid])))
        result = runner.execute(StepPlan(step_id=step, seqs=tuple(seqs), new_requests=tuple(new)))
        for rid, token in result.sampled.items():
            history[rid].append(token)
        out.append(result.sampled)
    return out


def test_compiled_steps_never_recompile_and_match_eager(tiny_model_dir: Path) -> None:
    kwargs = dict(device="cpu", dtype="float32", num_kv_blocks=32, block_size=4, num_threads=1)
    eager = TorchRunner(tiny_model_dir, RunnerConfig(**kwargs))
    eager.load()
    # One sequence a step at most (max_num_seqs=1), so the graphs of several rows are never
    # compiled: their compiling would go on in the background through the tests after this
    # one (test_native_decode_graph.py has them). The steps of 2 and 3 sequences run eager.
    compiled = TorchRunner(tiny_model_dir, RunnerConfig(compile=True, max_num_seqs=1, **kwargs))
    assert compiled.load().impl == "native+compiled"
    compiled.warmup()
    graph = compiled.model.decode_graph
    before_swap = _run(compiled)  # while it compiles (or before it is ready): the eager step serves
    assert graph.wait_ready(300)
    if sys.platform == "linux":  # the compile took idle cycles only: it ran at the lowest priority
        assert graph.compile_nice == 19
    assert os.getpriority(os.PRIO_PROCESS, 0) == 0  # ...and the calling thread kept its own
    runs = []
    inner = graph.compiled
    graph.compiled = lambda *args: runs.append(1) or inner(*args)
    torch._dynamo.config.error_on_recompile = True
    try:
        got = _run(compiled)
    finally:
        torch._dynamo.config.error_on_recompile = False
    assert got == _run(eager) == before_swap
    assert len(runs) == 6  # "a" decoding alone ran the graph (steps 12-17), no other step did
    assert graph.classes == [] and graph.mixed == []


_CACHE_DIR_PROBE = """
import os, sys, torch
seen = []
def fake_compile(fn, **kwargs):  # what torch.compile does first: import inductor
    seen.append(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
    import torch._inductor.config  # noqa: F401
    return fn
torch.compile = fake_compile
from actors.runners.runner_config import RunnerConfig
from actors.runners.torch_runner import TorchRunner
TorchRunner(sys.argv[1], RunnerConfig(device="cpu", dtype="float32", num_kv_blocks=8, block_size=4, num_threads=1, compile=True)).load()
print(seen[0], os.environ["TORCHINDUCTOR_CACHE_DIR"])
"""


def test_inductor_cache_lives_under_home_not_tmp(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A restart loads compiled kernels from ~/.cache/switchyard/inductor: the directory is set
    before the first torch.compile, since importing inductor pins its /tmp default."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["HOME"] = str(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # and any packages beside it (ops/gpu/check.sh's)
    out = subprocess.run([sys.executable, "-c", _CACHE_DIR_PROBE, str(tiny_model_dir)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    expected = str(tmp_path / ".cache" / "switchyard" / "inductor")
    assert out.stdout.split()[-2:] == [expected, expected]


def test_the_cpu_default_compiles_in_the_background_and_the_flag_turns_it_off(tiny_model_dir: Path) -> None:
    """RuntimeConfig's compile=None (the default, `switchyard serve` without --compile): on for
    the native path on a CPU, with the spare KV blocks its compiling calls run in (the longest
    of them: graph_steps.SCRATCH_TOKENS tokens); eager
    with --no-compile and on the batch-invariant path."""
    from actors.runners.native.graph_steps import SCRATCH_TOKENS
    from api.process.flags import parse_args

    assert parse_args(["serve"]).config.compile is None
    assert parse_args(["serve", "--no-compile"]).config.compile is False
    kwargs = dict(device="cpu", dtype="float32", num_kv_blocks=8, block_size=4, num_threads=1)
    default = TorchRunner(tiny_model_dir, RunnerConfig(compile=None, **kwargs))
    info = default.load()
    assert info.impl == "native+compiled" and info.num_kv_blocks == 8
    assert default.k_cache[0].shape[1] == (8 + -(-SCRATCH_TOKENS // 4)) * 4
    for settings in (dict(compile=False), dict(compile=None, batch_invariant=True)):
        eager = TorchRunner(tiny_model_dir, RunnerConfig(**kwargs, **settings))
        assert "compiled" not in eager.load().impl and eager.k_cache[0].shape[1] == 8 * 4
