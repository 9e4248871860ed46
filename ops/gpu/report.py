"""The GPU check's results: one JSON and a summary table from what its stages left behind.

    python -m ops.gpu.report --work WORK --out OUT [--dry-run]

Reads the stage log check.sh keeps (`stages.tsv`: name, status, exit code, seconds, note) and
each stage's file in WORK (preflight.json, tests.xml, models.json, bandwidth.json,
step_ab-embedded.json, step_ab-llama-1b.json, sweep-graphs.json, sweep-serial.json,
sweep-eager.json, sweep-spec.json, merged into one `sweep`; a stage that failed or was skipped left none, and its
part says so), and writes OUT/gpu-check.json and OUT/summary.md, the table
also printed, and `problems`: each stage that did not pass, each failed test, each server
section or level with errors (exit status 3 when there is any; 0 when none). Derived here:

- `hbm`: per model and batch, the CUDA-graph step's tokens/s against the bandwidth bound:
  B tokens per step, and a step reads the weights once plus each row's keys and values (the
  128-token prompt and half the timed steps), at the copy bandwidth measured in the same run;
- `server_steps`: the graphs server's steps from its debug `step` log lines, decode-only steps
  and steps with prompt tokens apart (how many, p50 and p99 ms): whether prompts stall streams;
- `targets`, the GPU check's (each over one run on one card): decode steps as CUDA graphs >= 2x
  the eager step at batch 1 on the embedded model's shape; the server at c=64 >= 1/1.2 of the
  bare CUDA-graph step over the same work (prefill plus decode); the 1B shape at batch 1 >= 0.6
  of the bandwidth bound; at c=32 a stream's chunk gap p99 <= 2x its p50, per server variant.
  A dry run computes them too, on a CPU and tiny sizes, where they mean nothing.
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from ops.harness.baselines import workload_tok_s
from ops.harness.results import fmt, machine, utc_now
from ops.harness.servers import step_lines
from ops.harness.stats import ms, percentile, ratio

PROMPT_TOKENS = 128
SERVERS = {
    "switchyard": "graphs", "switchyard:nographs": "eager", "switchyard:serial": "graphs, serial",
    "switchyard:interval4": "graphs, stream interval 4", "switchyard:off": "graphs, drafting off (spec stage)",
    "switchyard:ngram": "graphs, --spec-decoding ngram", "switchyard:auto": "graphs, --spec-decoding auto",
    "switchyard:split": "graphs, --engine-process", "switchyard:split2": "graphs, --api-servers 2",
}  # fmt: skip
MODELS = ("embedded", "llama-1b")
# check.sh's dry run sweeps one server a stage (the two front ends' of the eager stage's three,
# the n-gram one) and skips the serial stage
DRY_RUN_UNSWEPT = ("switchyard:serial", "switchyard:interval4", "switchyard:off", "switchyard:auto", "switchyard:nographs", "switchyard:split")
DRY_RUN_SKIPS = [
    "install: the carried wheels (CI has none; the local environment has every package)",
    "CUDA: the GPU-only tests skip themselves; `native` and `native+nographs` both run eager on a CPU (no capture)",
    "bandwidth: host memory, not HBM",
]


def read(work: Path, name: str) -> Any:
    path = work / name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def stages(work: Path) -> list[dict[str, Any]]:
    """check.sh's stage log: one row per stage, in order."""
    rows = []
    path = work / "stages.tsv"
    for line in path.read_text().splitlines() if path.exists() else []:
        name, status, rc, seconds, note = (line.split("\t") + [""] * 5)[:5]
        rows.append({"name": name, "status": status, "rc": int(rc) if rc.lstrip("-").isdigit() else None, "seconds": int(seconds or 0), "note": note})
    return rows


def tests(xml_path: Path) -> dict[str, Any] | None:
    """pytest's junit XML: counts, and each failure's test and first line."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return None
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return None
    failures = []
    for case in suite.iter("testcase"):
        for kind in ("failure", "error"):
            found = case.find(kind)
            if found is not None:
                first = (found.get("message") or found.text or "").strip().splitlines()
                failures.append({"test": f"{case.get('classname')}::{case.get('name')}", "kind": kind, "message": first[0][:300] if first else ""})
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {**counts, "seconds": round(float(suite.get("time", 0)), 1), "failed": failures}


def kv_bytes_per_token(model: dict[str, Any]) -> int:
    """Keys and values of one token in every layer, in bf16."""
    heads, kv_heads = model["heads"]
    return 2 * model["layers"] * kv_heads * (model["hidden"] // heads) * 2


def hbm(step_ab: dict[str, Any] | None, model: dict[str, Any] | None, bandwidth: dict[str, Any] | None) -> dict[str, Any]:
    """Per batch: the CUDA-graph step's tokens/s, the bandwidth bound, and their ratio."""
    if not step_ab or not model or not bandwidth:
        return {}
    context = PROMPT_TOKENS + step_ab.get("steps", 0) // 2
    out = {}
    for batch, variants in step_ab.get("batches", {}).items():
        step_ms = variants.get("native", {}).get("step_ms")
        if not step_ms:
            continue
        b = int(batch)
        read = model["weight_bytes_per_step"] + b * context * kv_bytes_per_token(model)
        tok_s = b * 1000 / step_ms
        bound = b * bandwidth["gb_s"] * 1e9 / read
        out[batch] = {"tok_s": round(tok_s, 1), "bound_tok_s": round(bound, 1), "fraction": ratio(tok_s, bound), "bytes_per_step": read}
    return out


def level(section: dict[str, Any] | None, c: int) -> dict[str, Any] | None:
    levels = ((section or {}).get("sweep") or {}).get("levels", [])
    return next((lv for lv in levels if lv["concurrency"] == c), None)


def stall(lv: dict[str, Any] | None) -> float | None:
    """A level's chunk gap p99 over its p50."""
    return ratio(lv["itl_chunk_ms"]["p99"], lv["itl_chunk_ms"]["p50"], 2) if lv else None


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPU check's targets over this run, each with its value, goal and whether it was met."""
    ab = (result.get("step_ab") or {}).get("embedded") or {}
    b1 = ab.get("batches", {}).get("1", {})
    speedup = ratio(b1.get("native+nographs", {}).get("step_ms"), b1.get("native", {}).get("step_ms"), 2)
    sweep = result.get("sweep") or {}
    over_bare = ((sweep.get("ratios") or {}).get("switchyard") or {}).get("tok_s_over_bare_native_workload[native]_per_level", {})
    fraction = ((result.get("hbm") or {}).get("llama-1b") or {}).get("1", {}).get("fraction")
    rows = [
        ("decode steps as CUDA graphs over eager, B=1, embedded shape", speedup, ">=", 2.0),
        ("server c=64 over the bare CUDA-graph step (same work)", over_bare.get("64"), ">=", round(1 / 1.2, 3)),
        ("1B shape, B=1: tokens/s over the bandwidth bound", fraction, ">=", 0.6),
    ]
    bare = result.get("bare_step") or {}
    for key, flags in (("switchyard:split", "--engine-process"), ("switchyard:split2", "--api-servers 2")):  # issue 40: the engine in its own process
        for c in (64, 128):
            split = level(sweep.get(key), c)
            rows.append((f"server c={c} over the bare CUDA-graph step, {flags}", ratio(split.get("output_tok_s") if split else None, bare.get(str(c), {}).get("workload_tok_s")), ">=", 0.8))
    rows += [(f"c=32 chunk gap p99/p50, {label}", stall(level(sweep.get(key), 32)), "<=", 2.0) for key, label in SERVERS.items()]
    out = []
    for name, value, op, goal in rows:
        met = None if value is None else (value >= goal if op == ">=" else value <= goal)
        out.append({"target": name, "value": value, "goal": f"{op} {goal}", "met": met})
    return out


def problems(result: dict[str, Any]) -> list[str]:
    """What did not work, one line each: stages, tests, server sections and their levels."""
    out = [f"stage {s['name']}: {s['status']} {s['note']}".rstrip() for s in result["stages"] if s["status"] not in ("ok", "skipped")]
    out += [f"test {f['test']}: {f['message']}" for f in (result.get("tests") or {}).get("failed", [])]
    sweep = result.get("sweep") or {}
    for key in SERVERS if sweep else ():
        if result.get("dry_run") and key in DRY_RUN_UNSWEPT:
            continue
        section = sweep.get(key) or {}
        if "sweep" not in section:
            out.append(f"server {key}: {section.get('error', 'not measured')[:300]}")
        out += [f"server {key} c={lv['concurrency']}: {lv['errors']} errors {lv['error_kinds']}"[:400] for lv in section.get("sweep", {}).get("levels", []) if lv["errors"]]
    if sweep and (sweep.get("bare_native") or {}).get("error"):
        out.append(f"bare native step: {sweep['bare_native']['error']}")
    return out


def _stage_lines(result: dict[str, Any]) -> list[str]:
    lines = ["| stage | status | seconds | note |", "|---|---|---:|---|"]
    lines += [f"| {s['name']} | {s['status']} | {s['seconds']} | {s['note']} |" for s in result["stages"]]
    t = result.get("tests")
    lines += ["", f"tests: {t['passed']} passed, {t['failures']} failed, {t['errors']} errors, {t['skipped']} skipped in {t['seconds']} s" if t else "tests: no report"]
    lines += [f"- FAILED {f['test']}: {f['message']}" for f in (t or {}).get("failed", [])[:20]]
    bw = result.get("bandwidth")
    lines += ["", f"copy bandwidth: {fmt(bw['gb_s'])} GB/s (read + write)" if bw else "copy bandwidth: not measured", ""]
    return lines


def _step_lines(result: dict[str, Any]) -> list[str]:
    lines = ["### Decode step, CUDA graphs (`native`) against eager (`native+nographs`): ms per step", ""]
    lines += ["| model | B | graphs ms | eager ms | graphs speed-up | graphs tok/s | bandwidth bound tok/s | of bound |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in MODELS:
        ab = (result.get("step_ab") or {}).get(name)
        if not ab:
            lines.append(f"| {name} | not measured | | | | | | |")
            continue
        for batch, v in ab.get("batches", {}).items():
            g, e = v.get("native", {}).get("step_ms"), v.get("native+nographs", {}).get("step_ms")
            h = (result.get("hbm") or {}).get(name, {}).get(batch, {})
            lines.append(f"| {name} | {batch} | {fmt(g)} | {fmt(e)} | {fmt(ratio(e, g, 2))} | {fmt(h.get('tok_s'))} | {fmt(h.get('bound_tok_s'))} | {fmt(h.get('fraction'))} |")
    return [*lines, ""]


def _sweep_lines(result: dict[str, Any]) -> list[str]:
    sweep = result.get("sweep")
    if not sweep:
        return ["### Server sweep: not measured", ""]
    bare = result.get("bare_step") or {}
    lines = ["### Server sweep: 128-token prompts, 64 tokens out, c streams in a closed loop", ""]
    lines += ["| c | bare CUDA-graph step, decode tok/s | the same, over the server's work (prefill + decode) |", "|---:|---:|---:|"]
    lines += [f"| {c} | {fmt(b.get('decode_tok_s'))} | {fmt(b.get('workload_tok_s'))} |" for c, b in bare.items()]
    lines += ["", "| server | c | tok/s | over the bare step (same work) | TTFT p50 ms | chunk gap p50 ms | gap p99/p50 | errors |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, label in SERVERS.items():
        section = sweep.get(key) or {}
        if "sweep" not in section:
            lines.append(f"| {label} | not measured: {(section.get('error') or 'no result')[:200]} | | | | | | |")
            continue
        for lv in section["sweep"]["levels"]:
            c = lv["concurrency"]
            over = ratio(lv["output_tok_s"], bare.get(str(c), {}).get("workload_tok_s"))
            lines.append(
                f"| {label} | {c} | {fmt(lv['output_tok_s'])} | {fmt(over)} | {fmt(lv['ttft_ms']['p50'])} | {fmt(lv['itl_chunk_ms']['p50'])} | {fmt(stall(lv))} | {lv['errors']} |"
            )
    return [*lines, ""]


def merge_sweeps(work: Path) -> dict[str, Any] | None:
    """check.sh's four sweeps (graphs with the bare step; serial and --stream-interval 4; eager;
    drafting off, n-gram and auto) as one: the graphs run's results with the others' server
    sections beside its own."""
    parts = {name: read(work, f"sweep-{name}.json") for name in ("graphs", "serial", "eager", "spec")}
    found = [p for p in parts.values() if p]
    if not found:
        return None
    merged = dict(parts["graphs"] or {"levels": found[0].get("levels", [])})
    moved = [("serial", "switchyard:serial"), ("serial", "switchyard:interval4"), ("eager", "switchyard:nographs"), ("eager", "switchyard:split"), ("eager", "switchyard:split2")]
    moved += [("spec", f"switchyard:{side}") for side in ("off", "ngram", "auto")]
    for name, key in moved:
        if parts[name] and key in parts[name]:
            merged[key] = parts[name][key]
    merged.pop("markdown", None)
    return merged


def bare_step(sweep: dict[str, Any] | None) -> dict[str, Any]:
    """Per batch, the bare CUDA-graph step's decode tok/s and its tok/s over the server's work."""
    bare = (sweep or {}).get("bare_native") or {}
    batches = (bare.get("variants") or {}).get("native", {}).get("batches", {})
    steps = bare.get("decode_steps", 0)
    return {c: {"decode_tok_s": e.get("decode_tok_s"), "workload_tok_s": workload_tok_s(e, int(c), steps)} for c, e in batches.items()}


def server_steps(work: Path) -> dict[str, Any] | None:
    """The graphs server's steps over the whole sweep (check.sh starts it with --log-level debug)."""
    log_path = work / "logs" / "sweep-graphs" / "switchyard.log"
    if not log_path.exists():
        return None
    steps, _ = step_lines(log_path, 0)

    def kind(chosen: list[dict[str, Any]]) -> dict[str, Any]:
        # ms: from the step before it ending to this one's result applied (the whole pipeline);
        # runner_ms: the runner's own execute (host prep, forward, sampling). Their gap is the
        # event loop's and the hand-overs' share.
        seconds = [s["ms"] / 1e3 for s in chosen]
        runner = [s["runner_ms"] / 1e3 for s in chosen if "runner_ms" in s]
        return {
            "steps": len(seconds), "ms_p50": ms(percentile(seconds, 50)), "ms_p99": ms(percentile(seconds, 99)),
            "runner_ms_p50": ms(percentile(runner, 50)), "runner_ms_p99": ms(percentile(runner, 99)),
        }  # fmt: skip

    return {
        "decode_only": kind([s for s in steps if not s["prompt_tokens"]]),
        "with_prompt": kind([s for s in steps if s["prompt_tokens"]]),
    }


def spec_over_off(sweep: dict[str, Any] | None) -> dict[str, dict[str, float | None]]:
    """Per drafting server and c, its tok/s over the spec stage's own drafting-off server."""
    off = (sweep or {}).get("switchyard:off")
    out: dict[str, dict[str, float | None]] = {}
    for side in ("ngram", "auto"):
        section = (sweep or {}).get(f"switchyard:{side}")
        for lv in ((section or {}).get("sweep") or {}).get("levels", []):
            base = level(off, lv["concurrency"])
            out.setdefault(side, {})[str(lv["concurrency"])] = ratio(lv["output_tok_s"], base["output_tok_s"]) if base else None
    return out


def _spec_lines(result: dict[str, Any]) -> list[str]:
    spec = result.get("spec_over_off")
    if not spec:
        return []
    levels = sorted({int(c) for per in spec.values() for c in per})
    lines = ["### Drafting on the GPU: tok/s over drafting off (the spec stage's three servers)", ""]
    lines += ["| server | " + " | ".join(f"c={c}" for c in levels) + " |", "|---|" + "---:|" * len(levels)]
    lines += [f"| --spec-decoding {side} | " + " | ".join(fmt(per.get(str(c))) for c in levels) + " |" for side, per in spec.items()]
    return [*lines, ""]


def _server_step_lines(result: dict[str, Any]) -> list[str]:
    steps = result.get("server_steps")
    if not steps:
        return []
    lines = ["### The graphs server's steps (its step log, every level)", "", "| steps | how many | p50 ms | p99 ms | runner p50 ms | runner p99 ms |", "|---|---:|---:|---:|---:|---:|"]
    for name, label in (("decode_only", "decode only"), ("with_prompt", "with prompt tokens")):
        s = steps[name]
        lines.append(f"| {label} | {s['steps']} | {fmt(s['ms_p50'])} | {fmt(s['ms_p99'])} | {fmt(s.get('runner_ms_p50'))} | {fmt(s.get('runner_ms_p99'))} |")
    return [*lines, ""]


def markdown(result: dict[str, Any]) -> str:
    device = result.get("device") or {}
    title = f"## GPU check: {device.get('name') or device.get('device') or '?'}" + (" (DRY RUN on a CPU: tiny sizes, figures mean nothing)" if result["dry_run"] else "")
    lines = [title, "", f"{result['finished_utc']}, {result['machine']['cpu']}, torch {device.get('torch')}", "", *_stage_lines(result)]
    lines += [*_step_lines(result), *_sweep_lines(result), *_spec_lines(result), *_server_step_lines(result), "### Targets", "", "| target | value | goal | met |", "|---|---:|---|---|"]
    lines += [f"| {t['target']} | {fmt(t['value'])} | {t['goal']} | {'–' if t['met'] is None else 'yes' if t['met'] else 'NO'} |" for t in result["targets"]]
    lines += ["", "### Problems", "", *(f"- {line}" for line in result["problems"])] if result["problems"] else ["", "No problems."]
    if result["dry_run"]:
        lines += ["", "Skipped in the dry run: " + "; ".join(result["skipped_in_dry_run"])]
    return "\n".join(lines) + "\n"


def collect(work: Path, dry_run: bool) -> dict[str, Any]:
    """Every stage's output in WORK, and what follows from it."""
    preflight = read(work, "preflight.json") or {}
    models = read(work, "models.json") or {}
    result: dict[str, Any] = {
        "kind": "gpu-check", "dry_run": dry_run, "finished_utc": utc_now(), "machine": machine(), "device": preflight.get("device"),
        "python": preflight.get("python"), "packages": preflight.get("packages"), "preflight_problems": preflight.get("problems"),
        "preflight_warnings": preflight.get("warnings"), "stages": stages(work), "tests": tests(work / "tests.xml"), "models": models,
        "bandwidth": read(work, "bandwidth.json"), "step_ab": {name: read(work, f"step_ab-{name}.json") for name in MODELS}, "sweep": merge_sweeps(work),
    }  # fmt: skip
    result["bare_step"] = bare_step(result["sweep"])
    result["server_steps"] = server_steps(work)
    result["spec_over_off"] = spec_over_off(result["sweep"])
    meta = models.get("models", {})
    result["hbm"] = {name: hbm(result["step_ab"][name], meta.get(name), result["bandwidth"]) for name in MODELS}
    result["targets"] = targets(result)
    result["problems"] = problems(result)
    if dry_run:
        result["skipped_in_dry_run"] = DRY_RUN_SKIPS
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, help="check.sh's work directory")
    p.add_argument("--out", required=True, help="where gpu-check.json and summary.md go")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    result = collect(Path(args.work), args.dry_run)
    result["markdown"] = table = markdown(result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-check.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "summary.md").write_text(table)
    print(table)
    if result["problems"]:
        raise SystemExit(3)


if __name__ == "__main__":
    main()
