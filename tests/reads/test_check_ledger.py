"""`check_ledger`: silent on a ledger the real loops wrote, one line per planted violation."""

import datetime as dt

import pytest
from django.core.management import CommandError, call_command

from jobs.actions import control
from jobs.actions.submit import submit_job
from jobs.executors import Observation
from jobs.loops.launcher import launch_attempts
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Job, JobEvent
from jobs.reads.ledgercheck import violations
from jobs.schemas import JobIn
from jobs.states import JobStatus
from metering.models import UsageRecord
from metering.records import ENGINE_END_GRACE, meter_ended
from tests.factories import place, queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus


@pytest.fixture
def ran_ledger(backend, team, alice, make_user):
    """Jobs through the real scheduler, launcher and reconciler: one succeeded, one failed,
    one paused, one still queued behind the quota, one running."""
    team.gpu_quota = 3
    team.save()
    jobs = [submit_job(alice, JobIn(entrypoint=["true"], gpus=1)) for _ in range(4)]
    launch_attempts(admit_queued_jobs().admitted)
    refs = list(Attempt.objects.order_by("pk").values_list("job_ref", flat=True))
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    backend.states[refs[0]] = Observation("OK", exit_code=0, start_time=start)
    backend.states[refs[1]] = Observation("BAD", exit_code=3, start_time=start)
    backend.states[refs[2]] = Observation("RUN", start_time=start)
    reconcile_all()
    control.pause_job(alice, jobs[2].pk)
    launch_attempts(admit_queued_jobs().admitted)  # the fourth job takes the freed GPUs
    # The paused attempt waits for its engine's end (the scripted engine never says) until
    # the grace is past.
    meter_ended(now=dt.datetime.now(dt.UTC) + ENGINE_END_GRACE)
    return jobs


def test_a_ledger_written_by_the_real_loops_has_no_violations(ran_ledger, capsys):
    assert [j.status for j in Job.objects.order_by("pk")] == [
        S.SUCCEEDED,
        S.FAILED,
        S.PAUSED,
        S.PENDING,
    ]
    assert violations() == []
    call_command("check_ledger")
    assert capsys.readouterr().out == "ledger ok: no violations\n"


def test_a_status_written_around_the_transitions_is_reported(ran_ledger, capsys):
    place(ran_ledger[1], S.RUNNING)  # FAILED → RUNNING behind the table's back
    with pytest.raises(CommandError):
        call_command("check_ledger")
    out = capsys.readouterr().out
    job = ran_ledger[1].pk
    assert f"job {job}: the row says RUNNING but its last event says FAILED" in out
    assert f"job {job}: RUNNING without an open current attempt" in out


def test_a_forbidden_transition_in_a_timeline_is_reported(ran_ledger):
    job = ran_ledger[0]
    JobEvent.objects.create(
        job=job, kind=JobEvent.Kind.STATUS, from_status=S.SUCCEEDED, to_status=S.QUEUED, actor="x"
    )
    place(job, S.QUEUED)
    assert f"job {job.pk}: SUCCEEDED→QUEUED is not an allowed transition" in violations()


def test_a_team_over_its_quotas_is_reported_now_and_at_admission(team, alice, make_user):
    team.gpu_quota, team.max_jobs, team.user_gpu_cap = 4, 1, 2
    team.save()
    for _ in range(2):
        with_attempt(queued_job(team, alice, total_gpus=3), S.RUNNING)
    found = violations()
    assert "team vision: holds 6 GPUs, quota 4" in found
    assert "team vision: runs 2 jobs, slots 1" in found
    assert "team vision: alice holds 6 GPUs, per-member cap 2" in found
    # An admission event recorded under a quota the replayed timeline exceeds.
    job = queued_job(team, alice, total_gpus=2)
    JobEvent.objects.create(job=job, kind=JobEvent.Kind.STATUS, to_status=S.QUEUED, actor="a")
    JobEvent.objects.create(
        job=job,
        kind=JobEvent.Kind.STATUS,
        from_status=S.QUEUED,
        to_status=S.SUBMITTED,
        actor="scheduler",
        data={"gpu_quota": 1, "max_jobs": None, "user_gpu_cap": None},
    )
    assert f"job {job.pk}: admitted while its team held 2 GPUs, limit 1" in violations()


def test_open_attempts_of_finished_jobs_and_unlaunched_attempts_are_reported(team, alice, settings):
    done = queued_job(team, alice)
    with_attempt(done, S.SUCCEEDED)
    stale = queued_job(team, alice)
    old = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=settings.SF_LOST_GRACE_S + 5)
    with_attempt(stale, S.SUBMITTED, submitted_at=old)
    found = violations()
    assert f"job {done.pk}: SUCCEEDED but an attempt is still open" in found
    assert f"job {stale.pk}: attempt sf-{stale.run_id}-a1 has no backend object after" in " ".join(
        found
    )


def test_billing_from_before_admission_is_reported(team, alice):
    job = queued_job(team, alice)
    now = dt.datetime.now(dt.UTC)
    with_attempt(job, S.SUCCEEDED, submitted_at=now, start_time=now - dt.timedelta(hours=1))
    Attempt.objects.filter(job=job).update(end_time=now)
    assert f"job {job.pk}: attempt sf-{job.run_id}-a1 is billed from before it was admitted" in (
        violations()
    )


def test_tampered_usage_records_are_reported(ran_ledger):
    UsageRecord.objects.update(gpu_us=1)
    found = [line for line in violations() if "the records say 1 GPU-µs" in line]
    assert len(found) == UsageRecord.objects.count() >= 1


def test_a_backend_object_alive_behind_a_closed_attempt_is_an_orphan(
    backend, team, alice, monkeypatch, settings
):
    ended = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=settings.SF_LOST_GRACE_S + 5)
    orphan, gone = queued_job(team, alice), queued_job(team, alice)
    for job, ref in ((orphan, "ref-1"), (gone, "ref-2")):
        with_attempt(job, S.STOPPED, job_ref=ref, start_time=ended, end_time=ended)
    backend.states["ref-1"] = Observation("RUN")
    backend.states["ref-2"] = Observation("HALTED")
    found = [line for line in violations() if "backend object" in line]
    assert found == [
        f"job {orphan.pk}: attempt sf-{orphan.run_id}-a1 ended at "
        f"{ended:%Y-%m-%d %H:%M:%S} but its backend object ref-1 on cluster local is still RUN"
    ]
    backend.poll_error = RuntimeError("controller down")
    assert "cluster local: its backend objects could not be checked (controller down)" in (
        violations()
    )


def test_a_backend_object_no_attempt_accounts_for_is_an_orphan(
    backend, team, alice, monkeypatch, settings
):
    grace = dt.timedelta(seconds=settings.SF_LOST_GRACE_S)
    now = dt.datetime.now(dt.UTC)
    running, recent, unrecorded = (queued_job(team, alice) for _ in range(3))
    with_attempt(running, S.RUNNING, job_ref="ref-open", start_time=now)
    just = now - grace / 2  # closed within the grace: the reconciler cancels it again
    with_attempt(recent, S.STOPPED, job_ref="ref-recent", start_time=just, end_time=just)
    with_attempt(unrecorded, S.SUBMITTED, job_ref="")  # launched, ref not recorded yet
    backend.existing.add(f"sf-{unrecorded.run_id}-a1")
    for ref in ("ref-open", "ref-recent", f"sf-{unrecorded.run_id}-a1"):
        backend.states[ref] = Observation("RUN")
    backend.states["ref-ghost"] = Observation("QUEUED", name="sf-ghost-a1")
    backend.states["ref-done"] = Observation("OK")  # ended objects are no one's concern
    found = [line for line in violations() if "backend object" in line]
    assert found == [
        "cluster local: backend object ref-ghost (sf-ghost-a1) is QUEUED but no attempt in "
        "the ledger launched it"
    ]
