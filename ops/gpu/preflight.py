"""Does this machine have what the GPU check needs? Seconds, before anything long starts.

    python -m ops.gpu.preflight [--device cuda] [--out preflight.json]

Checks every runtime requirement of pyproject.toml and the test requirements the engine tier
uses (pytest, pytest-trio, httpx), and what each of them requires in turn, against the versions
installed (the carried wheels on PYTHONPATH, and the machine's own image), imports the whole
serving stack, and, for a CUDA device, that torch sees it and runs a kernel on it. One line per problem, naming the package
and what is needed; exit 1 if there is any. torch and transformers are the image's: their
versions are recorded, and a difference from the pins CI tests against is a warning, not a
failure, as is a mismatch between two of the image's own packages. gguf is carried for the
engine tier's tests of the shipped Q4_1 blocks (they pin the CPU); the check's models are
random-weight ones (models.py), never converted from the GGUF.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tomllib
from importlib import metadata
from typing import Any

from packaging.requirements import Requirement

from ops.harness.results import REPO_ROOT

IMAGE_PACKAGES = ("torch", "transformers")  # the GPU image's own: recorded, never carried
TEST_PACKAGES = ("pytest", "pytest-trio", "httpx")  # what tests/engine needs of the test extra
IMPORT_NAMES = {"quart-trio": "quart_trio", "prometheus-client": "prometheus_client", "pytest-trio": "pytest_trio", "pillow": "PIL"}
STACK = ("actors.build", "actors.runners.torch_runner", "api.process.main", "llguidance.torch", "ops.bench.run.cli", "ops.bench.step_ab")


def requirements() -> list[Requirement]:
    """pyproject's runtime requirements and the test ones the engine tier needs, parsed."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    return reqs + [r for r in map(Requirement, project["optional-dependencies"]["test"]) if r.name in TEST_PACKAGES]


def carried_names() -> list[str]:
    """The distributions ops/gpu/wheels.txt carries."""
    from packaging.utils import canonicalize_name

    lines = (line.split("#")[0].strip() for line in (REPO_ROOT / "ops" / "gpu" / "wheels.txt").read_text().splitlines())
    return [canonicalize_name(Requirement(line).name) for line in lines if line]


def check_packages() -> tuple[dict[str, str | None], list[str], list[str]]:
    """(installed versions, problems, warnings) for every requirement and, walking their
    metadata, every requirement of theirs (markers evaluated here, extras left out); torch's
    and transformers' own are the image's business and are not walked."""
    from packaging.utils import canonicalize_name

    versions: dict[str, str | None] = {}
    problems, warnings = [], []
    carried = {"pyproject.toml", *carried_names()}  # a mismatch there is ours to fix; between the image's packages, a warning
    queue = [(req, "pyproject.toml") for req in requirements()]
    while queue:
        req, wanted_by = queue.pop(0)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name, first = canonicalize_name(req.name), canonicalize_name(req.name) not in versions
        try:
            version: str | None = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = None
        versions[name] = version
        if version is None:
            if first:
                problems.append(f"missing {name} ({req}, for {wanted_by}): carry its wheel (ops/gpu/wheels.txt, ops/gpu/wheels.sh)")
            continue
        if not req.specifier.contains(version, prereleases=True):
            line = f"{name} {version} does not satisfy {req} (for {wanted_by})"
            if name in IMAGE_PACKAGES:
                warnings.append(line + ": the image's own; CI tests the pin")
            elif wanted_by in carried:
                problems.append(line + ": carry a wheel that does (ops/gpu/wheels.txt)")
            else:
                warnings.append(line + ": between the image's own packages")
        if first and name not in IMAGE_PACKAGES:
            queue += [(dep, name) for dep in map(Requirement, metadata.requires(name) or [])]
    for top in requirements():
        problems += _imports(canonicalize_name(top.name), versions.get(canonicalize_name(top.name)))
    return versions, problems, warnings


def _imports(name: str, version: str | None) -> list[str]:
    """A top-level requirement that is installed imports (a wrong-ABI wheel fails here)."""
    if version is None:
        return []
    try:
        importlib.import_module(IMPORT_NAMES.get(name, name.replace("-", "_")))
    except Exception as exc:  # noqa: BLE001 - whatever it raises, one line
        return [f"{name} {version} is installed but does not import: {type(exc).__name__}: {exc}"]
    return []


def check_stack() -> list[str]:
    """The serving stack and the drivers import (a dependency missing from the list fails here)."""
    problems = []
    for module in STACK:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - reported, one line each
            problems.append(f"import {module} failed: {type(exc).__name__}: {exc}")
    return problems


def check_device(device: str) -> tuple[dict[str, Any], list[str]]:
    """torch's view of `device`, and what is wrong with it."""
    import torch

    info: dict[str, Any] = {"device": device, "torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if not device.startswith("cuda"):
        return info, []
    if not torch.cuda.is_available():
        return info, [f"torch {torch.__version__} sees no CUDA device (on a CPU machine run the dry run: ops/gpu/check.sh --dry-run)"]
    index = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(index)
    info.update(name=props.name, capability=f"{props.major}.{props.minor}", memory_gib=round(props.total_memory / 2**30, 1), sms=props.multi_processor_count)
    try:
        x = torch.ones(1024, device=device, dtype=torch.bfloat16)
        assert float((x @ x).item()) == 1024.0
    except Exception as exc:  # noqa: BLE001 - e.g. no kernel image for this card
        return info, [f"a bf16 kernel on {device} failed: {type(exc).__name__}: {exc}"]
    return info, []


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="the device the check runs on (default cuda; the dry run: cpu)")
    p.add_argument("--out", default=None, help="write what was found here as JSON")
    args = p.parse_args(argv)
    versions, problems, warnings = check_packages()
    problems += check_stack()
    device, device_problems = check_device(args.device)
    problems += device_problems
    result = {"python": sys.version.split()[0], "executable": sys.executable, "packages": versions, "device": device, "problems": problems, "warnings": warnings}
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")
    print(f"preflight: python {result['python']}, torch {device['torch']} (CUDA {device['torch_cuda']}), device {args.device}" + (f": {device['name']}" if "name" in device else ""))
    for line in warnings:
        print(f"preflight: warning: {line}")
    for line in problems:
        print(f"preflight: FAILED: {line}")
    if problems:
        raise SystemExit(1)
    print(f"preflight: ok ({len(versions)} packages)")


if __name__ == "__main__":
    main()
