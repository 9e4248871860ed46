"""`switchyard serve-ray`'s outer process: it runs the Ray driver (api/cluster/deploy.py) as a
child in a session of its own, and turns every stop signal into one SIGTERM to that child.

Why: a local Ray instance's own processes (GCS server, raylet, the workers' parent) are
started in the driver's process group. A SIGTERM to that group (systemd, a benchmark's
killpg, a process supervisor) killed them at the same moment as the driver, so the driver's
orderly stop (Serve drains the replicas, then the instance goes down) called a controller that
could no longer reach its GCS and waited out its whole bound (45 s), while the orphaned
replicas, proxy and actors lingered for a minute more. With the instance in the child's
session, a signal to serve-ray's group reaches this process alone, and the child stops
everything in order. If this process dies (SIGKILL), the kernel sends the child SIGTERM
(Linux's parent-death signal), so the instance is never left behind.

No Ray import: the child imports Ray; the exit status is the child's.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import Any

DRIVER_ENV = "SWITCHYARD_RAY_DRIVER"  # set in the child: it is the driver, not another supervisor
_PR_SET_PDEATHSIG = 1


def is_driver() -> bool:
    return os.environ.get(DRIVER_ENV) == "1"


def supervise(argv: list[str]) -> int:
    """Run `switchyard <argv>` as the driver in a new session until it exits; its status."""
    command = [sys.executable, "-c", "from api.process.main import main; main()", *argv]
    parent = os.getpid()
    child = subprocess.Popen(command, env={**os.environ, DRIVER_ENV: "1"}, start_new_session=True, preexec_fn=lambda: _die_with(parent))

    def forward(signum: int, frame: Any) -> None:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)  # the driver drains; a second signal is forwarded too

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    status = child.wait()
    return status if status >= 0 else 128 - status


def _die_with(parent: int) -> None:
    """In the child, before exec: SIGTERM when the supervisor dies (Linux; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
