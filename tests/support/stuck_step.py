"""A stuck device step, injected from the test side into a serve-ray replica's process.

`install` is the Ray tier's `worker_process_setup_hook` (tests/cluster/conftest.py's ray.init: Ray imports a
hook given by module path only from the job's runtime_env, and every worker of the job runs
it). It does nothing in a process whose runtime_env has no $SWITCHYARD_STUCK_DIR, which only
a test's replica deployment sets (`runtime_env(...)`, tests/support/cluster.py's Deployer). There it wraps
the real runner's `execute` so that, in the replica whose id names a file in that directory,
the next step blocks for good, as a hung device call would: the executor's step clock runs on,
the trio loop and the health check keep answering. Nothing in the product knows of it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

STUCK_DIR_ENV = "SWITCHYARD_STUCK_DIR"


# Ray's workers import the installed packages (api, actors, runtime) but not this checkout's
# tests/: without the checkout on their path the hook's import fails, every worker dies at
# start, and serve.start() waits for its controller for good (a fresh clone under `make test`).
_CHECKOUT = str(Path(__file__).resolve().parents[2])
JOB_RUNTIME_ENV = {
    "worker_process_setup_hook": f"{__name__}.install",
    "env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [_CHECKOUT, os.environ.get("PYTHONPATH")]))},
}


def install() -> None:
    if STUCK_DIR_ENV not in os.environ:
        return
    from actors.runners.torch_runner import TorchRunner

    stuck_dir = Path(os.environ[STUCK_DIR_ENV])
    execute = TorchRunner.execute
    never = threading.Event()

    def maybe_stuck_execute(self: TorchRunner, plan: Any) -> Any:
        replica = _replica_id()
        if replica and (stuck_dir / replica).exists():
            never.wait()  # until Ray kills the process
        return execute(self, plan)

    TorchRunner.execute = maybe_stuck_execute  # type: ignore[method-assign]


def _replica_id() -> str:
    from ray import serve

    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # warm-up, before the replica's context is set
        return ""


def runtime_env(stuck_dir: Path) -> dict[str, Any]:
    """A replica deployment's runtime_env that arms the hook."""
    return {"env_vars": {STUCK_DIR_ENV: str(stuck_dir)}}
