"""The row-invariant C kernels, built once per machine and loaded with ctypes.

Owns: compiling `*.c` here with the system's C compiler (`cc`, or `$CC`) for this CPU
(`-march=native`), into a cache keyed by the sources, the flags, the compiler and the CPU's
features (`~/.cache/switchyard/kernels`, or `$SWITCHYARD_KERNEL_CACHE`), and loading the
library. A build takes a few seconds; a second process finds it built. The library's
OpenMP calls run on torch's own OpenMP runtime (torch loads `libgomp.so.1` first and the
library links that soname), so kernels and torch share one thread pool.

Why C through ctypes rather than a torch extension: no torch headers, no ninja, a build of
seconds, and ctypes releases the GIL for each call as a torch op does.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

SOURCES = ("common.h", "linear.c", "attention.c", "rows.c", "lora.c", "stack.c")
FLAGS = ("-O3", "-fopenmp", "-fPIC", "-shared", "-ffp-contract=off", "-std=gnu11")
HERE = Path(__file__).parent
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_C = ctypes.c_int
SIGNATURES = {
    "sy_linear": (_P, _I, _I, _I, _P, _F, _P, _C, _I, _P, _C, _P, _I, _P, _C, _I, _C),
    "sy_rope_attention": (_P, _I, _I, _C, _C, _C, _P, _P, _P, _P, _P, _P, _I, _P, _I, _C, _P, _C, _F, _P, _C),
    "sy_attention": (_P, _I, _C, _C, _C, _P, _P, _I, _P, _I, _C, _P, _P, _C, _F, _P, _C),
    "sy_rmsnorm": (_P, _I, _I, _I, _P, _F, _P, _I, _C),
    "sy_rope_write": (_P, _I, _I, _C, _C, _C, _P, _P, _P, _P, _P, _P, _P, _I, _C),
    "sy_silu_mul": (_P, _I, _I, _P, _C),
    "sy_lora_add": (_P, _I, _I, _I, _P, _P, _I, _P, _P, _I, _I, _P, _I, _C),
    "sy_stack": (_P, _I, _I, _C, _P, _F, _C, _C, _C, _P, _P, _P, _P, _I, _P, _I, _C, _P, _C, _F, _P, _P, _P, _C),
}


class KernelsUnavailable(RuntimeError):
    """No C compiler, or the build failed: the message says which, in one line."""


_lock = threading.Lock()
_loaded: ctypes.CDLL | None = None


def cache_dir() -> Path:
    return Path(os.environ.get("SWITCHYARD_KERNEL_CACHE") or Path.home() / ".cache" / "switchyard" / "kernels")


def compiler() -> str:
    found = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not found:
        raise KernelsUnavailable("the row-invariant kernels need a C compiler (cc or $CC), and none is on PATH")
    return found


def _key(cc: str, march: str) -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((HERE / name).read_bytes())
    digest.update(" ".join((*FLAGS, march)).encode())
    digest.update(subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.encode())
    digest.update(_cpu_features().encode())
    return digest.hexdigest()[:20]


def _cpu_features() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def library_path(march: str = "native") -> Path:
    """The library built for `-march` (native: this CPU), building it first if need be."""
    cc = compiler()
    target = cache_dir() / f"rowwise-{march}-{_key(cc, march)}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        sources = [str(HERE / name) for name in SOURCES if name.endswith(".c")]
        done = subprocess.run([cc, *FLAGS, f"-march={march}", "-o", str(out), *sources, "-lm"], capture_output=True, text=True)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no output"])[0]
            raise KernelsUnavailable(f"building the row-invariant kernels with {cc} failed: {first}")
        os.replace(out, target)  # atomic: a process building beside this one loads either copy
    return target


def load(march: str = "native") -> ctypes.CDLL:
    """A library built for `march`, its argument types set (tests load the plain C build too)."""
    import torch  # noqa: F401  (its libgomp must be the one the library binds to)

    lib = ctypes.CDLL(str(library_path(march)))
    for name, args in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = None
    return lib


def library() -> ctypes.CDLL:
    """The kernels for this CPU, loaded once (built on first use)."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is None:
            _loaded = load()
        return _loaded
