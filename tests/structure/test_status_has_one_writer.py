"""Invariant 1: nothing but jobs/ledger/transitions.py assigns a job's status."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"jobs/ledger/transitions.py"}
WRITING_CALLS = {"update", "create", "get_or_create", "update_or_create", "bulk_update"}


def status_writes(source: str) -> list[int]:
    """Line numbers that assign `.status`, or pass status= / "status" to a writing ORM call."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "status" for t in targets):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in WRITING_CALLS and (
                any(k.arg in ("status", "defaults") for k in node.keywords) and _names_status(node)
            ):
                lines.append(node.lineno)
    return lines


def _names_status(call: ast.Call) -> bool:
    text = ast.unparse(call)
    return (
        "status=" in text.replace("status_reason=", "").replace("status_changed_at=", "")
        or "'status'" in text
    )


def test_only_the_transition_function_assigns_status():
    offenders = []
    for path in [
        *ROOT.glob("jobs/**/*.py"),
        *ROOT.glob("metering/**/*.py"),
        *ROOT.glob("starforge/**/*.py"),
    ]:
        rel = path.relative_to(ROOT).as_posix()
        if rel in ALLOWED or "/migrations/" in rel:
            continue
        offenders += [f"{rel}:{n}" for n in status_writes(path.read_text())]
    assert offenders == []


def test_the_detector_finds_each_way_of_writing_status():
    assert status_writes("job.status = JobStatus.FAILED")
    assert status_writes("Job.objects.filter(pk=1).update(status='FAILED')")
    assert status_writes("Job.objects.create(status=S.RUNNING, team=t)")
    assert not status_writes("Job.objects.filter(status=S.QUEUED).update(status_reason='x')")
    assert not status_writes("if job.status == JobStatus.FAILED: pass")
