"""One writer per field of per-request state: runtime/request.py's table, checked against the code.

The table names, for every field of `Prompt`, `RequestContext`, `Sequence`, the runner's
`RequestState` and `DecodeState`, the one actor that writes it. This test reads every shipped module (api/, runtime/, actors/)
and fails on a write to such a field (assignment, augmented assignment, item assignment, a
mutating method call like `.append`, or construction) from a module outside the field's
owner, and on a field the table leaves out or names twice. Every message between actors must be
frozen, so a receiver cannot write it either, and a step plan shares no container with the core:
the device thread reads it while the scheduler may already be planning the next one.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import msgspec
import pytest

import actors.runners.request_state
import actors.sequence
import runtime.messages
import runtime.request
from tests.support import ROOT

SHIPPED = ("api", "runtime", "actors")
STATE_CLASSES = {
    "Prompt": runtime.request.Prompt,
    "RequestContext": runtime.request.RequestContext,
    "DecodeState": runtime.request.DecodeState,
    "Sequence": actors.sequence.Sequence,
    "RequestState": actors.runners.request_state.RequestState,
}
# Every message between actors (runtime/messages.py), the step boundary's included.
CROSSING = (
    "TokenizedRequest", "AbortRequest", "Shutdown", "RegisterRequest", "TokenDelta", "StepOutputs", "DropRequests",
    "NewRequest", "ForkedSeq", "ScheduledSeq", "StepPlan", "Logprob", "StepResult", "Usage", "TextDelta",
)  # fmt: skip

MUTATORS = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault", "sort", "reverse", "add", "discard"}
# Writes to an attribute that shares a name with a state field but belongs to another object:
# (receiver as written, attribute) -> what it is.
UNRELATED: dict[tuple[str, str], str] = {
    ("pending", "text"): "runtime/mailbox.py merging a TextDelta",
    ("pending", "token_ids"): "runtime/mailbox.py merging a TextDelta",
    ("pending", "prompt_logprobs"): "runtime/mailbox.py merging a TextDelta",
    ("info", "status"): "the HTTP edge's EdgeInfo for one response",
}


def ownership_table() -> str:
    """runtime/request.py's comment block that starts at `# Owners`, without the `# `."""
    lines = Path(runtime.request.__file__).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# Owners"))
    block = []
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        block.append(line[2:])
    return "\n".join(block)


def parse_table() -> tuple[dict[str, tuple[str, ...]], dict[tuple[str, str], str]]:
    """(owner -> its module paths, (class, field) -> owner) from runtime/request.py's table."""
    doc = ownership_table()
    owners_block = doc.split("Owners", 1)[1].split("\n\n", 2)[1]
    owners = {line.split()[0]: tuple(line.split()[1:]) for line in owners_block.splitlines() if line.strip()}
    rows: dict[tuple[str, str], str] = {}
    for cls, name, owner in re.findall(r"^ {4}([A-Z]\w*)\.(\w+) +(\w+)", doc, re.M):
        assert (cls, name) not in rows, f"{cls}.{name} is in the table twice"
        rows[cls, name] = owner
    return owners, rows


def fields_of(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(cls.__struct_fields__)


def owned_by(path: str, owners: dict[str, tuple[str, ...]]) -> set[str]:
    return {owner for owner, prefixes in owners.items() if any(path == p or (p.endswith("/") and path.startswith(p)) for p in prefixes)}


def writes(source: str) -> list[tuple[int, str, str, str | None]]:
    """(line, receiver, attribute written, state class constructed or None) for every write.

    `self.x = ...` counts only inside a state class: elsewhere it is that object's own field.
    """
    found: list[tuple[int, str, str, str | None]] = []

    def visit(node: ast.AST, in_state_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_state_class
            if isinstance(child, ast.ClassDef):
                inside = child.name in STATE_CLASSES
            for target in _targets(child):
                if isinstance(target, ast.Subscript):  # x.f[k] = v writes x.f
                    target = target.value
                if isinstance(target, ast.Attribute) and (inside or not _is_self(target.value)):
                    found.append((target.lineno, ast.unparse(target.value), target.attr, None))
            if isinstance(child, ast.Call):
                func = child.func
                if isinstance(func, ast.Attribute) and func.attr in MUTATORS and isinstance(func.value, ast.Attribute):
                    if inside or not _is_self(func.value.value):
                        found.append((child.lineno, ast.unparse(func.value.value), func.value.attr, None))
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
                if name in STATE_CLASSES:
                    found.append((child.lineno, "", "", name))
            visit(child, inside)

    visit(ast.parse(source), False)
    return found


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        raw = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        raw = [node.target]
    elif isinstance(node, ast.Delete):
        raw = list(node.targets)
    else:
        return []
    out: list[ast.AST] = []
    while raw:
        t = raw.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            raw.extend(t.elts)
        elif isinstance(t, ast.Starred):
            raw.append(t.value)
        else:
            out.append(t)
    return out


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def violations(path: str, source: str) -> list[str]:
    """Writes in `path` to a state field whose owner is not `path`'s actor."""
    owners, rows = parse_table()
    field_owners: dict[str, set[str]] = {}
    for (_, name), owner in rows.items():
        field_owners.setdefault(name, set()).add(owner)
    class_owners = {cls: {o for (c, _), o in rows.items() if c == cls} for cls in STATE_CLASSES}
    mine = owned_by(path, owners)
    bad = []
    for line, receiver, attr, constructed in writes(source):
        if constructed is not None:
            if not class_owners[constructed] & mine:
                bad.append(f"{path}:{line} builds a {constructed}, owned by {sorted(class_owners[constructed])}")
        elif attr in field_owners and not field_owners[attr] & mine and (receiver, attr) not in UNRELATED:
            bad.append(f"{path}:{line} writes .{attr}, owned by {sorted(field_owners[attr])}")
    return bad


def shipped_modules() -> list[Path]:
    return sorted(p for top in SHIPPED for p in (ROOT / top).rglob("*.py"))


def test_the_table_names_every_field_once_with_a_known_owner() -> None:
    owners, rows = parse_table()
    expected = {(cls, name) for cls, klass in STATE_CLASSES.items() for name in fields_of(klass)}
    assert set(rows) == expected, f"missing: {sorted(expected - set(rows))}, stale: {sorted(set(rows) - expected)}"
    assert set(rows.values()) <= set(owners), set(rows.values()) - set(owners)
    for owner, paths in owners.items():
        for p in paths:
            assert (ROOT / p).exists(), f"owner {owner}: {p} does not exist"
    # One owner per class: no class is shared between actors.
    for cls in STATE_CLASSES:
        assert len({o for (c, _), o in rows.items() if c == cls}) == 1, cls


def test_no_module_writes_a_field_it_does_not_own() -> None:
    found = []
    for path in shipped_modules():
        rel = path.relative_to(ROOT).as_posix()
        found += violations(rel, path.read_text())
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("path", "source"),
    [
        # The shell's old copy of the cached count, and the tokenizer's old prompt counts.
        ("actors/scheduler.py", "ctx = self.requests.get(rid)\nctx.num_cached_tokens = item.start_pos\n"),
        ("actors/tokenizer.py", "sibling.num_truncated_tokens = 3\n"),
        ("actors/tokenizer.py", "ctx.aborted = True\n"),
        ("actors/scheduler.py", "state.batch_sizes.extend([1])\n"),
        ("actors/scheduler.py", "a, state.first_token_time = 1, 2\n"),
        ("actors/detokenizer.py", "seq.block_table[0] = 3\n"),
        ("actors/engine.py", "state = DecodeState(start=register)\n"),
        # The device thread writing the core's record: its tokens, its progress, its matcher slot.
        ("actors/runners/torch_runner.py", "seq.token_ids.append(token)\n"),
        ("actors/runners/logit_rows.py", "seq.num_computed_tokens += 1\n"),
        ("actors/executor.py", "seq.block_table = []\n"),
        # ...and the core writing the runner's.
        ("actors/sched_core.py", "state.history.append(token)\n"),
        ("api/http/app.py", "stream.ctx.siblings.append(other)\n"),
    ],
)
def test_a_write_from_the_wrong_actor_is_caught(path: str, source: str) -> None:
    assert violations(path, source), source


def test_the_owner_may_write_and_self_fields_of_other_objects_are_theirs() -> None:
    assert not violations("actors/detokenizer.py", "state.batch_sizes.extend([1])\nstate.detok = d\n")
    assert not violations("actors/engine.py", "ctx.aborted = True\nctx = RequestContext(request_id=r)\n")
    # An actor's own attribute that happens to share a field's name is not request state.
    assert not violations("actors/scheduler.py", "class SchedulerActor:\n    def f(self):\n        self.status = 1\n")
    # ...but inside a state class, self is that state.
    assert violations("actors/scheduler.py", "class Sequence:\n    def f(self):\n        self.status = 1\n")


@pytest.mark.parametrize("name", CROSSING)
def test_messages_between_actors_are_frozen(name: str) -> None:
    cls = getattr(runtime.messages, name)
    assert issubclass(cls, msgspec.Struct) and cls.__struct_config__.frozen, name


def test_a_plan_shares_no_container_with_the_core() -> None:
    """A list or dict of the core's in a plan would be read on the device thread while the core
    writes it (the history the old plans handed over by reference). Every container a real
    plan holds is its own: tuples at the plan level, fresh slices per sequence."""
    from actors.sched_core import SchedulerConfig, SchedulerCore
    from runtime.messages import StepResult, TokenizedRequest
    from runtime.sampling import SamplingParams

    core = SchedulerCore(SchedulerConfig(num_blocks=32, block_size=4))
    penalized = SamplingParams(max_tokens=4, frequency_penalty=0.5, prompt_logprobs=1)
    for rid in ("a", "b"):
        core.add(TokenizedRequest(request_id=rid, prompt_token_ids=[5, 6, 7, 8, 9], sampling=penalized, max_tokens=4, seed=1, arrival_time=0.0))
    plans = []
    for _ in range(3):
        plan = core.schedule()
        assert plan is not None
        plans.append(plan)
        core.update(plan, StepResult(step_id=plan.step_id, sampled={s.request_id: 11 for s in plan.seqs if s.sample}))
    core_containers = {id(c) for seq in core.requests.values() for c in (seq.token_ids, seq.block_table, seq.prompt_logprobs)}
    for plan in plans:
        for seq in plan.seqs:
            assert not {id(seq.token_ids), id(seq.block_table)} & core_containers, seq.request_id
        assert all(isinstance(value, tuple) for value in (plan.seqs, plan.new_requests, plan.freed_request_ids, plan.block_copies))


def test_a_plan_cannot_be_written_on_the_device_thread() -> None:
    plan = runtime.messages.StepPlan(step_id=1, seqs=())
    with pytest.raises(AttributeError):
        plan.step_id = 2  # type: ignore[misc]
