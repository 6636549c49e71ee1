"""No event, answer or page shows a team another team's figures (issue 47, point 10).

A team that borrows idle GPUs learns that its job borrowed and how many GPUs, never who lent
them nor the lender's quota or holdings: its admission event once held the lender's id, name,
quota and GPUs held, and its reasons, Diagnostics and the API named the lender. The borrower's
member reads every answer about the job, from admission through a preemption notice to the
PAUSED that follows; none holds the lender's name or a key of its figures. Staff may see who
lent (the API's `borrowed_from`), as they see every team.
"""

import datetime as dt
import json

import pytest
from django.test import Client

from jobs.executors.base import override
from jobs.models import Cluster, Job, JobEvent
from jobs.reads.diagnostics import explain
from tests.conftest import ApiClient
from tests.loops.borrowers import MIN, T0, Engine, ends, run_borrowers, tick

pytestmark = pytest.mark.django_db
LENDER = "orion"  # a name no sentence holds by chance
OWN_FIGURES = {
    "borrowed",
    "borrowed_gpus",
    "borrow_cap",
    "team_gpus",
    "team_jobs",
    "member_gpus",
    "gpu_quota",
    "max_jobs",
    "user_gpu_cap",
    "gpus",
    "grace_s",
}


@pytest.fixture
def world(db, make_team, make_user):
    """`orion` (quota 8, lendable) and `vision` (quota 0, may borrow 8) on a fake engine; vic,
    a member of vision, and ops, staff outside both."""
    Engine.notices, Engine.cancels, Engine.ends, Engine.gone = [], [], {}, set()
    cluster = Cluster.objects.create(name="gpu", kind="noop", settings={"preempt_grace_s": 90})
    with override(None, Engine):
        lender = make_team(LENDER, gpu_quota=8, cluster=cluster)
        lender.lendable = True
        lender.save()
        vision = make_team("vision", gpu_quota=0, cluster=cluster)
        vision.borrow_cap = 8
        vision.save()
        ops = make_user("ops")
        ops.is_staff = True
        ops.save()
        yield lender, make_user("lea", lender), vision, make_user("vic", vision), ops


def what_the_borrower_reads(vic, job: Job) -> dict[str, str]:
    """Every answer and page about the job that its team's member reads."""
    api = ApiClient(vic)
    console = Client()
    console.force_login(vic)
    paths = ("", "/events", "/attempts", "/diagnostics")
    answers = {f"GET /jobs/{job.pk}{p}": api.get(f"/jobs/{job.pk}{p}") for p in paths}
    answers["GET /jobs"] = api.get("/jobs")
    answers["console list"] = console.get("/")
    answers["console job page"] = console.get(f"/jobs/{job.pk}/")
    for where, response in answers.items():
        assert response.status_code == 200, (where, response.content[:300])
    read = {where: response.content.decode() for where, response in answers.items()}
    read["Diagnostics"] = "\n".join(explain(Job.objects.get(pk=job.pk)))
    return read


def assert_no_lender_figures(vic, job: Job) -> None:
    for where, text in what_the_borrower_reads(vic, job).items():
        assert LENDER not in text, (where, text[text.find(LENDER) - 200 :][:400])
    events = ApiClient(vic).get(f"/jobs/{job.pk}/events").json()
    for event in events:
        assert set(event["data"]) <= OWN_FIGURES, event


def test_a_borrowing_jobs_admission_shows_its_own_figures_only(
    world, django_capture_on_commit_callbacks
):
    _, _, vision, vic, ops = world
    (job,) = run_borrowers(vision, vic, django_capture_on_commit_callbacks, (8, 0, T0, None))
    admitted = JobEvent.objects.get(job=job, to_status="SUBMITTED")
    assert admitted.reason == (
        "admitted on GPUs borrowed from another team's idle quota (preemptible); launching"
    )
    assert admitted.data["borrowed"] is True and admitted.data["borrowed_gpus"] == 8
    assert ApiClient(vic).get(f"/jobs/{job.pk}").json()["borrowed"] is True
    assert_no_lender_figures(vic, job)
    read = ApiClient(ops).get(f"/jobs/{job.pk}").json()
    assert (read["borrowed"], read["borrowed_from"]) == (True, LENDER)  # staff see every team


def test_a_preempted_borrower_is_not_told_who_took_its_gpus_back(
    world, django_capture_on_commit_callbacks
):
    lender, lea, vision, vic, _ = world
    (job,) = run_borrowers(
        vision, vic, django_capture_on_commit_callbacks, (8, 0, T0 - 60 * MIN, None)
    )
    mine = Job.objects.create(
        run_id="lender-own",
        team=lender,
        user=lea,
        cluster=job.cluster,
        total_gpus=8,
        entrypoint=["x"],
    )
    tick(T0, django_capture_on_commit_callbacks)
    note = JobEvent.objects.get(job=job, kind=JobEvent.Kind.NOTE)
    assert note.reason.startswith("preemption notice: the lending team needs back the 8 GPUs")
    assert_no_lender_figures(vic, job)
    job.refresh_from_db()
    ends(job, "FAILED", 143, 40)
    job.refresh_from_db()
    assert job.status_reason == "preempted: borrowed GPUs returned to the lending team"
    assert_no_lender_figures(vic, job)
    # The lender's own job names itself, and counts what it took back.
    assert JobEvent.objects.get(job=mine, kind=JobEvent.Kind.NOTE).reason == (
        f"preempting 1 job(s) on 8 GPUs that other teams borrowed from team {LENDER}: this job "
        "needs them back"
    )


def test_events_written_before_lenders_went_unnamed_show_none_of_their_figures(world):
    lender, _, vision, vic, _ = world
    job = Job.objects.create(
        run_id="old",
        team=vision,
        user=vic,
        cluster=vision.default_cluster,
        total_gpus=2,
        entrypoint=["x"],
    )
    old = {
        "lender_id": lender.pk,
        "borrowed_from": LENDER,
        "lender_gpus": 6,
        "lender_quota": 8,
        "borrowed_gpus": 2,
        "borrow_cap": 8,
        "team_gpus": 0,
    }
    JobEvent.objects.create(
        job=job,
        kind="status",
        from_status="QUEUED",
        to_status="SUBMITTED",
        actor="scheduler",
        data=old,
    )
    JobEvent.objects.create(
        job=job, kind="note", actor="scheduler", data={"lender": LENDER, "gpus": 2, "grace_s": 90}
    )
    events = ApiClient(vic).get(f"/jobs/{job.pk}/events").json()
    assert [e["data"] for e in events] == [
        {"borrowed_gpus": 2, "borrow_cap": 8, "team_gpus": 0},
        {"gpus": 2, "grace_s": 90},
    ]
    assert LENDER not in json.dumps(events)


def test_the_ledger_check_finds_the_lender_on_the_attempt(
    world, django_capture_on_commit_callbacks
):
    """The borrower's event no longer names the lender, yet `check_ledger` still counts lent
    GPUs against the lender's quota at every admission: it reads the lender off the attempt."""
    from jobs.reads.ledgercheck import admissions

    lender, _, vision, vic, _ = world
    run_borrowers(vision, vic, django_capture_on_commit_callbacks, (8, 0, T0, None))
    now = dt.datetime.now(dt.UTC)
    assert list(admissions(now)) == []
    lender.gpu_quota = 4  # lowered since: the replay reads the lender's quota as it is now
    lender.save()
    (found,) = admissions(now)
    assert found.endswith("admitted while its team held 8 GPUs of its lender, limit 4")
