"""The sweep's sections: one per server (Switchyard, its variants, the peers) or baseline.

Owns: the section names (`switchyard`, `switchyard:<variant>`, `transformers_serve`,
`llama_server`), parsing `--switchyard-variants` ("name=server args;name=server args"),
running Switchyard under the sweep, and filling the bare baselines' sections (measured in
bounded subprocesses, or read back from an earlier run with --bare-from).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import time
from pathlib import Path
from typing import Any

from ops.harness import baselines
from ops.harness.load import sweep, switchyard_target
from ops.harness.results import log, read_json
from ops.harness.servers import switchyard_server

VARIANT_PREFIX = "switchyard:"  # results key of a variant's section: "switchyard:<name>"
PEERS = ("transformers_serve", "llama_server")
SECTIONS = ("switchyard", *PEERS)  # the server sections, Switchyard first


def sections(result: dict[str, Any]) -> list[str]:
    """The server sections of a run: Switchyard, its variants, then the peers."""
    variants = [k for k in result if k.startswith(VARIANT_PREFIX)]
    return [SECTIONS[0], *variants, *PEERS]


def parse_variants(spec: str) -> dict[str, tuple[Path | None, list[str]]]:
    """'native=--model-impl native;before@/tmp/wt=--spec-decoding off' → {name: (checkout, server
    args)}: `name@DIR` runs the server from another checkout (an earlier commit's worktree)."""
    out: dict[str, tuple[Path | None, list[str]]] = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, args = part.partition("=")
        name, at, checkout = name.strip().partition("@")
        if not name or not _:
            raise SystemExit(f"--switchyard-variants: {part!r} is not name[@checkout]=server args")
        out[name] = (Path(checkout) if at else None, shlex.split(args))
    return out


def run_switchyard(
    model: str | None, served_name: str, prompts: list[str], levels: list[int], log_dir: Path, server_args: list[str], startup_timeout: float,
    checkout: Path | None = None, **sweep_kwargs: Any,
) -> dict[str, Any]:  # fmt: skip
    """One Switchyard section: start it, sweep it, stop it; a failure is reported in the section."""
    out: dict[str, Any] = {"name": "switchyard", "log": str(log_dir / "switchyard.log"), **({"checkout": str(checkout)} if checkout else {})}
    started: list[Any] = []
    try:
        with switchyard_server(log_dir / "switchyard.log", [*(["--model", model] if model else []), *server_args], startup_timeout, checkout=checkout) as srv:
            started.append(srv)
            out.update(cmd=srv.cmd, startup_s=srv.startup_s, dtype=srv.dtype(served_name))
            t0 = time.monotonic()
            out["sweep"] = asyncio.run(sweep(switchyard_target(srv.base_url, served_name), prompts, levels, **sweep_kwargs))
            out["sweep_s"] = round(time.monotonic() - t0, 1)
    except Exception as e:  # noqa: BLE001 - reported in the results, the run goes on to the peers
        out["error"] = f"{type(e).__name__}: {e}"
        log(f"[switchyard] failed: {out['error'][:2000]}")
    if started:
        out["exit_code"] = started[0].info.get("exit_code")
    return out


def bare_sections(result: dict[str, Any], args: argparse.Namespace, model_dir: str, out_dir: Path, settle: Any) -> None:
    """The bare forward (measured, or read back with --bare-from) and, with --bare-native, the
    bare native step baseline and its name, into `result`. `settle(section)` runs before each."""
    if args.bare_from:
        loaded = read_json(args.bare_from)
        result["bare_forward"] = loaded.get("bare_forward", loaded)
        result["bare_forward_from"] = args.bare_from
    elif not args.skip_bare:
        settle("bare_forward")
        dtypes = [d for d in args.bare_dtypes.split(",") if d]
        result["bare_forward"] = baselines.run_bare_forward(
            model_dir, args.bare_batches or args.levels, dtypes, args.bare_steps, args.bare_threads, out_dir, args.bare_timeout
        )
    if args.bare_native:
        settle("bare_native")
        result["bare_native_baseline"] = args.bare_native_baseline
        batches = args.bare_batches or args.levels
        result["bare_native"] = baselines.run_bare_native(
            model_dir, args.bare_native, batches, "bfloat16", args.bare_steps, args.bare_threads, out_dir, args.bare_timeout
        )
