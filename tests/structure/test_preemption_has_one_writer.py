"""Preemption has one owner (docs/ARCHITECTURE.md, invariant 10): its one flag,
`Attempt.preempted_at`, is written by jobs/ledger/preemption.py alone, and no other field of
the ledger says again that a job was preempted."""

import ast

from django.apps import apps

from tests.structure.imports import ROOT, modules

OWNER = "jobs/ledger/preemption.py"
FLAG = "preempted_at"
WRITING_CALLS = {"update", "create", "get_or_create", "update_or_create", "bulk_update"}


def flag_writes(source: str) -> list[int]:
    """Lines that assign `.preempted_at`, or pass it to a writing ORM call (as a keyword, in
    `defaults`, or among `bulk_update`'s fields)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == FLAG for t in targets):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in WRITING_CALLS and _names_flag(node):
                lines.append(node.lineno)
    return lines


def _names_flag(call: ast.Call) -> bool:
    if any(k.arg == FLAG for k in call.keywords):
        return True
    written = [k.value for k in call.keywords if k.arg in (None, "defaults", "fields")]
    return any(
        isinstance(node, ast.Constant) and node.value == FLAG
        for value in [*written, *call.args]
        for node in ast.walk(value)
    )


def test_only_the_preemption_module_writes_the_preemption_flag():
    offenders = []
    for path in modules().values():  # the server's modules, migrations aside
        rel = path.relative_to(ROOT).as_posix()
        if rel == OWNER:
            continue
        offenders += [f"{rel}:{n}" for n in flag_writes(path.read_text())]
    assert offenders == []


def test_the_ledger_keeps_one_flag_for_a_preemption():
    fields = [
        f"{model.__name__}.{field.name}"
        for model in apps.get_app_config("jobs").get_models()
        for field in model._meta.get_fields()
        if "preempt" in field.name
    ]
    # The notice's time, and the lender's job it was sent for.
    assert sorted(fields) == ["Attempt.preempted_at", "Attempt.preempted_for"]


def test_the_detector_finds_each_way_of_writing_the_flag():
    assert flag_writes("attempt.preempted_at = now")
    assert flag_writes("Attempt.objects.filter(pk=1).update(preempted_at=now)")
    assert flag_writes("Attempt.objects.create(job=j, number=1, preempted_at=now)")
    assert flag_writes("Attempt.objects.bulk_update(rows, ['preempted_at'])")
    assert flag_writes("Attempt.objects.update_or_create(pk=1, defaults={'preempted_at': now})")
    assert flag_writes("Attempt.objects.filter(pk=1).update(**{'preempted_at': now})")
    assert not flag_writes(
        "Attempt.objects.filter(preempted_at__isnull=False).update(total_gpus=1)"
    )
    assert not flag_writes("if attempt.preempted_at is not None: pass")
    assert not flag_writes("rows.values_list('pk', 'preempted_at')")
