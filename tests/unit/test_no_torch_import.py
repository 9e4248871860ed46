"""The pure layers must not pull in torch: they run on the event loop and in light processes."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import ROOT

PURE_MODULES = [
    "runtime.messages",
    "runtime.sampling",
    "runtime.mailbox",
    "runtime.prefix_hash",
    "runtime.routing",
    "actors.sched_core",
    "actors.encode_ahead",
    "actors.sequence",
    "actors.embed_core",
    "runtime.request",
    "actors.blocks",
    "actors.detok_core",
    "api.http.openai.chat.params",
    "api.http.openai.chat.request",
    "api.http.openai.completions.params",
    "api.http.openai.completions.request",
]

_PROBE = """
import importlib, json, sys
seen = {}
for name in %r:
    importlib.import_module(name)
    seen[name] = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print(json.dumps(seen))
"""


def test_pure_modules_do_not_import_torch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE % (PURE_MODULES,)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(seen) == PURE_MODULES
    # Modules are imported in order, so the first non-empty entry names the culprit.
    assert {name: heavy for name, heavy in seen.items() if heavy} == {}
