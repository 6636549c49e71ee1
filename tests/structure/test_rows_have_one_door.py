"""Team, token and webhook rows are made by their actions, deliveries by the outbox, jobs by
`jobs.ledger.creation` (with their first QUEUED event, whether submitted, an array's task or a
follow-on): each kind of row has one module that creates it, so no door (API, console, CLI, a
management command) re-implements the checks made there. The Django admin saves through its
own forms, which call the same rules (`jobs/admin.py`), and the embedded default makes its demo
team's membership."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CREATED_BY = {
    "ApiToken": {"jobs/actions/tokens.py"},
    "Job": {"jobs/ledger/creation.py"},
    "Membership": {"jobs/actions/teams.py", "jobs/bootstrap.py"},
    "Webhook": {"jobs/actions/webhooks.py"},
    "WebhookDelivery": {"jobs/ledger/outbox.py"},
}
CREATING = {"create", "bulk_create", "get_or_create", "update_or_create"}


def creations(source: str, model: str) -> list[int]:
    """Lines that make a `model` row: `Model(...)` or `Model.objects.<create ...>(...)`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == model:
            lines.append(node.lineno)
        elif (
            isinstance(func, ast.Attribute)
            and func.attr in CREATING
            and ast.unparse(func.value) == f"{model}.objects"
        ):
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("model", sorted(CREATED_BY))
def test_each_kind_of_row_is_created_by_one_module(model):
    found = []
    for path in [*ROOT.glob("jobs/**/*.py"), *ROOT.glob("metering/**/*.py")]:
        rel = path.relative_to(ROOT).as_posix()
        if "/migrations/" not in rel:
            found += [rel for _ in creations(path.read_text(), model)]
    assert found and set(found) <= CREATED_BY[model]


def first_events(source: str) -> list[int]:
    """Lines that make a `JobEvent` whose `to_status` is spelled QUEUED: a job's first event
    (a requeue's is written by the one writer of status, to the state it is given)."""
    return [
        line
        for line in creations(source, "JobEvent")
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and node.lineno == line
        for keyword in node.keywords
        if keyword.arg == "to_status" and ast.unparse(keyword.value).endswith("QUEUED")
    ]


def test_a_jobs_first_event_is_written_in_one_place():
    found = []
    for path in [*ROOT.glob("jobs/**/*.py"), *ROOT.glob("metering/**/*.py")]:
        rel = path.relative_to(ROOT).as_posix()
        if "/migrations/" not in rel:
            found += [rel for _ in first_events(path.read_text())]
    assert found == ["jobs/ledger/creation.py"]


def test_the_detector_finds_each_way_of_creating_a_row():
    assert creations("Webhook.objects.create(owner=u)", "Webhook")
    assert creations("WebhookDelivery.objects.bulk_create(rows)", "WebhookDelivery")
    assert creations("rows = [WebhookDelivery(webhook=h) for h in hooks]", "WebhookDelivery")
    assert not creations("WebhookDelivery.objects.create(webhook=h)", "Webhook")
    assert not creations("Webhook.objects.filter(owner=u).delete()", "Webhook")
    assert first_events("JobEvent.objects.create(job=j, to_status=JobStatus.QUEUED)")
    assert first_events("rows = [JobEvent(job_id=pk, to_status=S.QUEUED) for pk in ids]")
    assert not first_events("JobEvent.objects.create(job=j, to_status=target)")
