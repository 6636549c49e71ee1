"""Clusters as data: settings validated per kind, the `cluster` command, and cluster health.

Health is what the scheduler (capacity) and the reconciler (poll) last saw of an engine; the
Diagnostics tab turns it into sentences for the jobs that depend on that cluster.
"""

import datetime as dt
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from jobs.executors import Capacity, Observation, override
from jobs.executors.base import KINDS, executor_class, validate_cluster_settings
from jobs.loops import scheduler
from jobs.loops.launcher import launch_spec
from jobs.loops.reconciler import reconcile_all
from jobs.models import Attempt, Cluster, Job, JobEvent, Team
from jobs.reads import diagnostics
from jobs.states import JobStatus
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
S = JobStatus


def test_every_cluster_kind_has_an_executor_with_a_state_table_and_settings_check():
    assert set(KINDS) == set(Cluster.Kind.values)
    for kind in KINDS:
        cls = executor_class(kind)
        assert cls.STATE_TABLE, kind
        assert callable(cls.validate_settings), kind


@pytest.mark.parametrize(
    "kind, given, words",
    [
        ("local", {"gpu_slot": 4}, "unknown setting(s) gpu_slot"),
        ("local", {"gpu_slots": -1}, "gpu_slots must be a whole number of at least 0"),
        ("local", {"max_jobs": True}, "max_jobs must be a whole number"),
        ("local", {"api_url": "ftp://x"}, "api_url must start with http"),
        ("local", {"output_root": ""}, "output_root must be a non-empty string"),
        ("noop", ["gpus"], "settings must be a JSON object"),
        ("mainframe", {}, "unknown cluster kind 'mainframe'"),
    ],
)
def test_bad_settings_are_refused_with_a_sentence(kind, given, words):
    with pytest.raises(ValueError) as caught:
        validate_cluster_settings(kind, given)
    assert words in str(caught.value)


def test_model_validation_reports_settings_errors_on_the_settings_field():
    cluster = Cluster(name="broken", kind="local", settings={"slots": 2})
    with pytest.raises(ValidationError) as caught:
        cluster.full_clean()
    assert "unknown setting(s) slots" in " ".join(caught.value.message_dict["settings"])


def test_cluster_command_adds_changes_lists_and_checks(team):
    out = StringIO()
    call_command(
        "cluster", "add", "big", "--kind", "local", "--set", "gpu_slots=2",
        "--set", "api_url=http://sf.internal:8000", "--default-for", team.name, stdout=out,
    )  # fmt: skip
    cluster = Cluster.objects.get(name="big")
    assert cluster.settings == {"gpu_slots": 2, "api_url": "http://sf.internal:8000"}
    assert Team.objects.get(pk=team.pk).default_cluster == cluster
    call_command("cluster", "set", "big", "--unset", "api_url", "--disable", stdout=out)
    cluster.refresh_from_db()
    assert cluster.settings == {"gpu_slots": 2} and not cluster.enabled
    call_command("cluster", "list", stdout=out)
    assert "big\tlocal\tdisabled" in out.getvalue()
    call_command("cluster", "check", "big", stdout=out)
    assert "cluster big is reachable: 2 virtual GPU slots" in out.getvalue()


def test_cluster_command_refuses_bad_settings_and_saves_nothing():
    with pytest.raises(CommandError, match="unknown setting"):
        call_command("cluster", "add", "x", "--kind", "local", "--set", "slotz=3")
    with pytest.raises(CommandError, match="KEY=VALUE"):
        call_command("cluster", "add", "x", "--kind", "local", "--set", "gpu_slots")
    assert not Cluster.objects.filter(name="x").exists()


def test_launch_spec_uses_the_clusters_api_url_and_output_root(team, alice, local_cluster):
    local_cluster.settings = {"api_url": "http://sf.svc:8000", "output_root": "/mnt/runs"}
    local_cluster.save()
    job = queued_job(team, alice)
    attempt = with_attempt(job, S.SUBMITTED)
    spec = launch_spec(Job.objects.get(pk=job.pk), attempt)
    assert spec.env["SF_API_URL"] == "http://sf.svc:8000"
    assert spec.env["SF_OUTPUT_DIR"] == f"/mnt/runs/{job.run_id}"
    assert spec.env["SF_CHECKPOINT_DIR"] == f"/mnt/runs/{job.run_id}/checkpoints"
    assert spec.team == team.name


class Unreachable:
    STATE_TABLE = {"RUN": S.RUNNING}

    def __init__(self, cluster) -> None:
        pass

    def capacity(self) -> Capacity:
        return Capacity(reachable=False, message="slurmctld at 10.0.0.5:6817 refused")


def test_an_unreachable_cluster_admits_nothing_and_diagnostics_says_so(team, alice, local_cluster):
    job = queued_job(team, alice)
    with override(None, Unreachable):
        scheduler.admit_queued_jobs()
    job.refresh_from_db()
    assert job.status == S.QUEUED
    assert "cannot be reached (slurmctld at 10.0.0.5:6817 refused)" in job.status_reason
    local_cluster.refresh_from_db()
    assert local_cluster.unreachable_reason == "slurmctld at 10.0.0.5:6817 refused"
    text = " ".join(diagnostics.explain(job))
    assert "Cluster local cannot be reached" in text and "Nothing is admitted" in text

    # the engine answers again: the health clears at the next tick
    scheduler.admit_queued_jobs()
    local_cluster.refresh_from_db()
    assert local_cluster.unreachable_since is None and local_cluster.unreachable_reason == ""


def test_a_failing_poll_changes_no_job_records_health_and_clears_when_it_answers(
    backend, team, alice, local_cluster
):
    job = queued_job(team, alice)
    past = timezone.now() - dt.timedelta(hours=1)
    with_attempt(job, S.RUNNING, job_ref="ref-1", pending_at=past, start_time=past)
    backend.poll_error = OSError("squeue: error: slurm_load_jobs: Unable to contact slurmctld")
    reconcile_all()
    job.refresh_from_db()
    local_cluster.refresh_from_db()
    assert job.status == S.RUNNING  # not declared lost: the cluster could not be asked
    assert "Unable to contact slurmctld" in local_cluster.poll_error
    assert "Polling cluster local fails" in " ".join(diagnostics.explain(job))

    backend.poll_error = None
    backend.states["ref-1"] = Observation("RUN", start_time=past)
    reconcile_all()
    local_cluster.refresh_from_db()
    assert local_cluster.poll_failing_since is None and local_cluster.poll_error == ""


def test_the_backends_pending_reason_is_kept_and_shown(backend, team, alice):
    job = queued_job(team, alice)
    attempt = with_attempt(job, S.PENDING, job_ref="ref-1", pending_at=timezone.now())
    backend.states["ref-1"] = Observation("QUEUED", message="Resources")
    reconcile_all()
    attempt.refresh_from_db()
    assert attempt.native_message == "Resources"
    job.refresh_from_db()
    assert "The backend says why it waits: Resources." in diagnostics.explain(job)

    backend.states["ref-1"] = Observation("QUEUED", message="Priority")
    reconcile_all()
    assert Attempt.objects.get(pk=attempt.pk).native_message == "Priority"
    # A changed reason is not a status change and not an unmapped observation.
    assert not JobEvent.objects.filter(job=job, kind=JobEvent.Kind.OBSERVATION).exists()
