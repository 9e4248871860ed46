"""The GPU check's CPU dry run (ops/gpu/check.sh --dry-run), so the script cannot rot while no
GPU runs it: every stage runs end to end on the CPU with tiny sizes (a tiny random model for
both shapes, batches 1 and 2, c = 1 and 2), and its results JSON, summary and output folder are
what ops/gpu/README.md says a GPU session gets back. Slow: about 70 s on 2 cores (three servers
start, each in its own process, and the bare step's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.slow

STAGES = ["install", "preflight", "tests", "models", "bandwidth", "step-ab-embedded", "step-ab-llama-1b", "sweep-graphs", "sweep-serial", "sweep-eager", "sweep-spec"]
SERVERS = ["switchyard", "switchyard:ngram", "switchyard:split2"]
UNSWEPT = ["switchyard:serial", "switchyard:interval4", "switchyard:off", "switchyard:auto", "switchyard:nographs", "switchyard:split"]  # a real run sweeps them too


def test_the_dry_run_runs_every_stage_and_reports_them(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    env.pop("SWITCHYARD_TEST_DEVICE", None)
    proc = subprocess.run(["bash", str(ROOT / "ops/gpu/check.sh"), "--dry-run", "--out", str(out)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "gpu-check: every stage passed" in proc.stdout
    # What comes back from a device call: at most 8 files, the log holding what was printed.
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.json", "gpu-check.log", "server-logs.tar.gz", "summary.md"]
    assert (out / "gpu-check.log").read_text() == proc.stdout
    assert not list(tmp_path.glob("gpu-check.*")), "the work directory is removed"

    result = json.loads((out / "gpu-check.json").read_text())
    assert result["dry_run"] is True and result["problems"] == []
    assert [(s["name"], s["status"]) for s in result["stages"]] == [(name, "skipped" if name in ("install", "sweep-serial") else "ok") for name in STAGES]
    assert result["device"]["device"] == "cpu" and result["packages"]["trio"]
    tests = result["tests"]
    assert tests["passed"] >= 2 and tests["failures"] == tests["errors"] == 0 and tests["skipped"] >= 1  # the GPU-only tests skip on a CPU
    assert result["bandwidth"]["gb_s"] > 0
    for model in ("embedded", "llama-1b"):
        assert set(result["step_ab"][model]["batches"]) == {"1", "2"}
        assert result["step_ab"][model]["impls"] == {"native": "native+bf16+rowwise", "native+nographs": "native+bf16+rowwise"}  # a CPU in bf16: the row-invariant kernels, no graph
        assert result["hbm"][model]["1"]["fraction"] > 0  # on a CPU the tiny shapes' weights stay in cache: no bound to stay under
        assert result["models"]["models"][model]["weight_bytes_per_step"] > 0

    sweep = result["sweep"]
    assert sweep["levels"] == [1, 2]
    for key in SERVERS:
        levels = sweep[key]["sweep"]["levels"]
        assert [lv["concurrency"] for lv in levels] == [1, 2] and all(lv["ok"] == lv["requests"] > 0 for lv in levels), key
    assert set(sweep["bare_native"]["variants"]["native"]["batches"]) == {"1", "2"}
    assert all(v is not None for v in sweep["ratios"]["switchyard"]["tok_s_over_bare_native_workload[native]_per_level"].values())
    assert set(result["bare_step"]) == {"1", "2"} and all(b["workload_tok_s"] for b in result["bare_step"].values())

    targets = {t["target"]: t for t in result["targets"]}
    # three of the step and the server, four of the engine process's (c=64, c=128; one and two front ends), a stall target per server (no value for the unswept)
    assert len(targets) == 3 + 4 + len(SERVERS) + len(UNSWEPT)
    assert targets["server c=64 over the bare CUDA-graph step, --engine-process"]["value"] is None  # no c=64 in a dry run
    assert targets["server c=128 over the bare CUDA-graph step, --api-servers 2"]["value"] is None
    assert targets["c=32 chunk gap p99/p50, graphs, stream interval 4"]["value"] is None
    assert targets["decode steps as CUDA graphs over eager, B=1, embedded shape"]["value"] is not None
    assert targets["server c=64 over the bare CUDA-graph step (same work)"]["value"] is None  # no c=64 in a dry run
    assert result["spec_over_off"] == {"ngram": {"1": None, "2": None}}  # no drafting-off server in a dry run

    summary = (out / "summary.md").read_text()
    assert summary == result["markdown"] and summary in proc.stdout
    assert "DRY RUN" in summary and "| sweep-spec | ok |" in summary and "### Drafting on the GPU" in summary and "### Targets" in summary and "No problems." in summary
