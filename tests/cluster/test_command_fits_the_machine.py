"""`switchyard serve-ray --replicas 2`, the README's example for a local Ray instance, comes up on
this machine with its defaults.

On a 2-core machine two replicas at the default 1 CPU and the ingress at 0.5 asked Ray for
2.5 CPUs: the ingress was never scheduled, /health never answered, forever. The defaults are
now lowered to fit the local instance, and the ready line says what was chosen. The command
as users run it (tests/cluster/test_command_stop.py's way), on the tiny model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support import ROOT as REPO_ROOT
from tests.support.cluster import log_tail, wait_ready
from tests.support.servers import free_port as _free_port


def test_two_replicas_with_default_cpus_come_up_and_say_what_they_chose(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = _free_port()
    log_path = tmp_path / "serve-ray.log"
    cmd = [
        sys.executable, "-m", "api.process.main", "serve-ray", "--replicas", "2", "--model", str(tiny_model_dir), "--served-name", "tiny",
        "--dtype", "float32", "--num-kv-blocks", "256", "--block-size", "4", "--no-embeddings", "--no-compile", "--drain-timeout", "2",
        "--host", "127.0.0.1", "--port", str(port), "--state-dir", str(tmp_path / "state"),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(proc, log_path)
        ready = next(json.loads(line) for line in log_path.read_text().splitlines() if '"serve_ray_ready"' in line)
        cpus = len(os.sched_getaffinity(0))
        assert ready["local_ray"]["cpus"] == cpus, ready
        assert 2 * ready["replica_cpus"] + ready["ingress_cpus"] <= cpus, ready
        if cpus < 2.5:  # the defaults ask 2.5 CPUs: lowered, and the line says so
            assert ready["local_ray"]["lowered_to_fit"] == {"replica_cpus": ready["replica_cpus"], "ingress_cpus": ready["ingress_cpus"]}, ready
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            assert http.get("/health").status_code == 200
            r = http.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            assert r.status_code == 200, r.text
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0, log_tail(log_path)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
