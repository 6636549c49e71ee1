"""Invariant 7: nothing but jobs/ledger/clocks.py writes an attempt's start or end, or opens one."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWNER = "jobs/ledger/clocks.py"
CLOCKS = {"start_time", "end_time"}
WRITING_CALLS = {"update", "create", "get_or_create", "update_or_create", "bulk_update"}


def clock_writes(source: str) -> list[int]:
    """Lines that assign `.start_time`/`.end_time`, pass them to a writing ORM call, or create
    Attempt rows."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr in CLOCKS for t in targets):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method, owner = node.func.attr, ast.unparse(node.func.value)
            if method in WRITING_CALLS and any(k.arg in CLOCKS for k in node.keywords):
                lines.append(node.lineno)
            elif method in {"create", "bulk_create"} and owner == "Attempt.objects":
                lines.append(node.lineno)
    return lines


def test_only_the_clocks_module_writes_attempt_times():
    offenders = []
    for path in [
        *ROOT.glob("jobs/**/*.py"),
        *ROOT.glob("metering/**/*.py"),
        *ROOT.glob("starforge/**/*.py"),
    ]:
        rel = path.relative_to(ROOT).as_posix()
        if rel == OWNER or "/migrations/" in rel:
            continue
        offenders += [f"{rel}:{n}" for n in clock_writes(path.read_text())]
    assert offenders == []


def test_the_detector_finds_each_way_of_writing_a_clock():
    assert clock_writes("attempt.end_time = now")
    assert clock_writes("Attempt.objects.filter(pk=1).update(start_time=now)")
    assert clock_writes("Attempt.objects.filter(pk=1).update(end_time=now, end_reason='x')")
    assert clock_writes("Attempt.objects.bulk_create(rows)")
    assert clock_writes("Attempt.objects.create(job=j, number=1)")
    assert not clock_writes("Observation('RUNNING', start_time=started)")
    assert not clock_writes("Attempt.objects.filter(end_time__isnull=True).update(job_ref='r')")
    assert not clock_writes("if attempt.end_time is None: pass")
