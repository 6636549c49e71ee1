"""Issue 47, point 4: membership bounds a member's reach. Once a member is removed or a user
deactivated, their waiting work in the team (QUEUED jobs, array tasks, pending automatic
retries, paused jobs) is STOPPED with a sentence saying why; their running jobs go on as the
team's work, with a note each and a list for the team's admins; admission re-checks
membership and `is_active`; their personal webhook tells them nothing more about the team's
jobs. Every door is tried: the team API, the Django admin, and a change no signal sees."""

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone

from jobs.actions import webhooks
from jobs.ledger.transitions import transition
from jobs.loops import deliveries
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Job, JobArray, JobEvent, Membership, Webhook, WebhookDelivery
from jobs.states import JobStatus as S
from tests.conftest import ApiClient
from tests.factories import place, queued_job, with_attempt
from tests.receiver import Receiver

pytestmark = pytest.mark.django_db


@pytest.fixture
def ada(make_user, team):
    return make_user("ada", team, role="admin")


@pytest.fixture
def nlp(make_team):
    return make_team("nlp")


@pytest.fixture
def receiver(settings):
    settings.SF_WEBHOOK_ALLOWED_NETS = ["127.0.0.0/8"]  # the receiver lives on loopback
    made = Receiver()
    yield made
    made.close()


def alices_work(team, alice) -> dict[str, Job]:
    """One job of alice's in each state that matters, and two tasks of an array of hers."""
    array = JobArray.objects.create(team=team, user=alice, spec="0-1", size=2)
    retrying = with_attempt(queued_job(team, alice), S.FAILED).job
    Job.objects.filter(pk=retrying.pk).update(
        next_attempt_at=timezone.now() + dt.timedelta(minutes=5), max_retries=3
    )
    return {
        "queued": queued_job(team, alice),
        "task0": queued_job(team, alice, array=array, array_index=0),
        "task1": queued_job(team, alice, array=array, array_index=1),
        "retrying": retrying,
        "paused": place(queued_job(team, alice), S.PAUSED),
        "running": with_attempt(queued_job(team, alice), S.RUNNING).job,
        "failed": with_attempt(queued_job(team, alice), S.FAILED).job,  # no retry pending
    }


def status_of(jobs: dict[str, Job]) -> dict[str, str]:
    return {name: Job.objects.get(pk=job.pk).status for name, job in jobs.items()}


def assert_waiting_work_stopped(jobs: dict[str, Job], why: str) -> None:
    assert status_of(jobs) == {
        "queued": S.STOPPED,
        "task0": S.STOPPED,
        "task1": S.STOPPED,
        "retrying": S.STOPPED,
        "paused": S.STOPPED,
        "running": S.RUNNING,  # goes on as the team's work
        "failed": S.FAILED,  # ended already: stays as it ended
    }
    for name in ("queued", "task0", "retrying", "paused"):
        job = Job.objects.get(pk=jobs[name].pk)
        assert why in job.status_reason, (name, job.status_reason)
        assert job.next_attempt_at is None  # the automatic retry is cancelled
    note = JobEvent.objects.get(job=jobs["running"], kind=JobEvent.Kind.NOTE)
    assert why in note.reason and "goes on as the team's work" in note.reason


def test_a_removed_members_waiting_work_stops_and_their_running_job_is_the_teams(
    team, alice, ada, make_user
):
    bob = make_user("bob", team)
    bobs = queued_job(team, bob)
    jobs = alices_work(team, alice)
    answer = ApiClient(ada).client.delete("/api/v1/teams/vision/members/alice")
    assert answer.status_code == 204, answer.content
    assert_waiting_work_stopped(jobs, "alice is no longer a member of team vision")
    assert Job.objects.get(pk=bobs.pk).status == S.QUEUED  # a teammate's work is untouched
    listed = ApiClient(ada).get("/teams/vision/inherited-jobs")
    assert listed.status_code == 200
    assert listed.json() == [
        {
            "id": jobs["running"].pk,
            "name": "",
            "status": S.RUNNING,
            "user": "alice",
            "why": "alice is no longer a member of team vision",
        }
    ]
    page = _console(ada).get("/teams/vision/").content.decode()
    assert f'<a href="/jobs/{jobs["running"].pk}/">' in page.split("members who left")[1]
    assert ApiClient(bob).get("/teams/vision/inherited-jobs").status_code == 403
    assert admit_queued_jobs().admitted and Job.objects.get(pk=bobs.pk).status == S.SUBMITTED


def test_removal_in_one_team_leaves_their_work_in_another(team, nlp, alice, ada):
    Membership.objects.create(team=nlp, user=alice, role="member")
    elsewhere = queued_job(nlp, alice)
    here = queued_job(team, alice)
    Membership.objects.get(team=team, user=alice).delete()  # as the admin's team inline does
    assert Job.objects.get(pk=here.pk).status == S.STOPPED
    assert Job.objects.get(pk=elsewhere.pk).status == S.QUEUED


def test_a_user_deactivated_in_the_admin_has_their_waiting_work_stopped_in_every_team(
    team, nlp, alice
):
    Membership.objects.create(team=nlp, user=alice, role="member")
    jobs = {**alices_work(team, alice), "nlp": queued_job(nlp, alice)}
    staff = User.objects.create_superuser("root", password="pw")
    form = {
        "username": "alice",
        "first_name": "",
        "last_name": "",
        "email": "",
        # is_active left out: the checkbox unticked
        "date_joined_0": "2030-01-01",
        "date_joined_1": "00:00:00",
        "initial-date_joined_0": "2030-01-01",
        "initial-date_joined_1": "00:00:00",
    }
    answer = _console(staff).post(f"/admin/auth/user/{alice.pk}/change/", form)
    assert answer.status_code == 302, answer.content.decode()[:2000]
    assert not User.objects.get(pk=alice.pk).is_active
    assert Job.objects.get(pk=jobs.pop("nlp").pk).status == S.STOPPED
    assert_waiting_work_stopped(jobs, "alice's account was deactivated")
    # Saving the inactive account again notes nothing twice.
    alice.refresh_from_db()
    alice.save()
    assert JobEvent.objects.filter(job=jobs["running"], kind=JobEvent.Kind.NOTE).count() == 1


@pytest.mark.parametrize(
    "change, why",
    [
        (
            lambda team, u: _sql("DELETE FROM jobs_membership WHERE user_id = %s", u.pk),
            "alice is no longer a member of team vision",
        ),
        (
            lambda team, u: _sql("UPDATE auth_user SET is_active = %s WHERE id = %s", False, u.pk),
            "alice's account is deactivated",
        ),
        (
            lambda team, u: Membership.objects.filter(team=team, user=u).update(role="viewer"),
            "alice is now a viewer in team vision, and a viewer cannot submit jobs",
        ),
    ],
    ids=["removed-in-sql", "deactivated-in-sql", "made-viewer"],
)
def test_admission_rechecks_membership_and_is_active(team, alice, make_user, change, why):
    """What no signal sees (an UPDATE or DELETE in SQL, a role change) admission catches."""
    bob = make_user("bob", team)
    hers, retry, his = queued_job(team, alice), queued_job(team, alice), queued_job(team, bob)
    with_attempt(retry, S.FAILED)
    Job.objects.filter(pk=retry.pk).update(next_attempt_at=timezone.now() - dt.timedelta(1))
    change(team, alice)
    tick = admit_queued_jobs()
    for job in (hers, retry):  # the due retry was queued, then stopped: never admitted
        job.refresh_from_db()
        assert job.status == S.STOPPED and job.attempt_count <= 1
        assert (
            job.status_reason == f"stopped at admission: {why}; it does not run as the team's work"
        )
    assert Job.objects.get(pk=his.pk).status == S.SUBMITTED
    assert sorted(tick.outsiders) == sorted([hers.pk, retry.pk])
    assert admit_queued_jobs().outsiders == []  # a second tick changes nothing


def test_a_follow_on_of_a_departed_members_job_is_never_admitted(team, alice, ada):
    parent = with_attempt(queued_job(team, alice), S.RUNNING).job
    Job.objects.filter(pk=parent.pk).update(then=["eval"])
    Membership.objects.get(team=team, user=alice).delete()
    child = queued_job(team, alice, parent=parent, follow_on_name="eval")  # as lifecycle makes
    admit_queued_jobs()
    child.refresh_from_db()
    assert child.status == S.STOPPED and "no longer a member" in child.status_reason


def test_a_removed_members_personal_webhook_is_told_nothing_more(team, alice, ada, receiver):
    webhooks.create(alice, receiver.url, ["failed", "stopped"])
    running = with_attempt(queued_job(team, alice), S.RUNNING).job
    before = with_attempt(queued_job(team, alice), S.RUNNING).job
    transition(before.pk, S.FAILED, actor="test", reason="exited 1; last lines:\nsecret-line")
    assert WebhookDelivery.objects.filter(job=before).count() == 1  # written while a member
    assert ApiClient(ada).client.delete("/api/v1/teams/vision/members/alice").status_code == 204
    transition(running.pk, S.FAILED, actor="test", reason="exited 1; last lines:\nsecret-line")
    assert not WebhookDelivery.objects.filter(job=running).exists()  # none written after
    deliveries.deliver_due()
    assert receiver.requests == []  # and the one written before is refused at its try
    refused = WebhookDelivery.objects.get(job=before)
    assert refused.state == WebhookDelivery.State.GAVE_UP and refused.payload is None
    assert "no longer in the job's team" in refused.tries[0]["detail"]


def test_a_deactivated_owners_webhooks_send_nothing(team, alice, ada, receiver):
    mine = webhooks.create(alice, receiver.url, ["failed"])
    teams = webhooks.create(ada, receiver.url, ["failed"], team_name="vision")
    User.objects.filter(pk=ada.pk).update(is_active=False)  # no signal: the check is at the try
    job = with_attempt(queued_job(team, alice), S.RUNNING).job
    transition(job.pk, S.FAILED, actor="test", reason="exited 1")
    assert not WebhookDelivery.objects.filter(webhook=teams).exists()
    User.objects.filter(pk=alice.pk).update(is_active=False)
    deliveries.deliver_due()
    assert receiver.requests == []
    assert "deactivated" in WebhookDelivery.objects.get(webhook=mine).tries[0]["detail"]
    assert Webhook.objects.count() == 2  # kept: a reactivated owner is told again


def _sql(statement: str, *params) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def _console(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client
