"""`jobs.ledger.creation`, step by step: `build` gives a job its run id and waiting reason,
`follow_on` builds a follow-on from what its parent asked for, and `queue` writes jobs with the
first QUEUED event of each and kicks the scheduler once, after commit."""

import pytest

from jobs.ledger import creation
from jobs.models import Job, JobEvent, ScheduleWindow, Snapshot
from jobs.states import JobStatus
from tests.factories import queued_job

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("kicks")]
S = JobStatus


@pytest.fixture
def parent(team, alice) -> Job:
    """A job that asked for everything a job can ask for, on two nodes, with a follow-on."""
    return queued_job(
        team,
        alice,
        total_gpus=8,
        nodes=2,
        name="train",
        gpu_type="a100",
        cpus=16,
        memory_mb=65536,
        image="ghcr.io/lab/train:3",
        env={"SEED": "7"},
        snapshot=Snapshot.objects.create(sha256="ab" * 32, size=1),
        priority=5,
        window=ScheduleWindow.objects.create(name="nights", spec="mon-sun 20:00-08:00"),
        window_policy=Job.WindowPolicy.PAUSE,
        pending_deadline_s=600,
        max_retries=2,
        retry_cooldown_s=45,
        time_limit_s=7200,
        then=["eval"],
        follow_on_specs={"eval": {"entrypoint": ["python", "eval.py"], "gpus": 2}},
    )


def test_a_built_job_has_a_run_id_of_its_own_and_waits_for_the_scheduler(team, alice):
    one, two = (
        creation.build(team=team, user=alice, cluster=team.default_cluster, entrypoint=["a"])
        for _ in range(2)
    )
    assert one.pk is None and one.status == S.QUEUED
    assert one.status_reason == two.status_reason == "waiting for the scheduler's next tick"
    assert len(one.run_id) == 16 and one.run_id != two.run_id


def test_a_follow_on_asks_for_what_its_parent_asked_for(parent):
    child = creation.follow_on(parent, "eval", parent.follow_on_specs["eval"])
    for field in creation.INHERITED:
        assert getattr(child, field) == getattr(parent, field), field
    assert (child.gpu_type, child.cpus, child.memory_mb, child.image) == (
        "a100",
        16,
        65536,
        "ghcr.io/lab/train:3",
    )
    assert child.window_policy == Job.WindowPolicy.PAUSE


def test_a_follow_on_runs_its_own_command_on_its_own_gpus_on_one_node(parent):
    child = creation.follow_on(parent, "eval", parent.follow_on_specs["eval"])
    assert (child.entrypoint, child.total_gpus, child.nodes) == (["python", "eval.py"], 2, 1)
    assert (child.parent, child.follow_on_name, child.name) == (parent, "eval", "train → eval")
    assert (child.then, child.follow_on_specs) == ([], {})
    assert child.run_id != parent.run_id


def test_a_follow_on_without_gpus_asks_for_no_gpu_type(parent):
    child = creation.follow_on(parent, "eval", {"entrypoint": ["python", "eval.py"], "gpus": 0})
    assert (child.total_gpus, child.gpu_type, child.cpus) == (0, "", 16)


def test_queue_writes_each_job_with_its_first_queued_event(team, alice):
    jobs = [
        creation.build(team=team, user=alice, cluster=team.default_cluster, entrypoint=[str(i)])
        for i in range(3)
    ]
    made = creation.queue(jobs, "submitted", actor="alice")
    assert [job.pk for job in made] == sorted(Job.objects.values_list("pk", flat=True))
    events = JobEvent.objects.order_by("job_id")
    assert [e.job_id for e in events] == [job.pk for job in made]
    for event in events:
        assert (event.kind, event.from_status, event.to_status) == ("status", "", S.QUEUED)
        assert (event.reason, event.actor) == ("submitted", "alice")


def test_queue_gives_each_job_the_reason_a_function_says(parent):
    children = [
        creation.follow_on(parent, name, {"entrypoint": ["x"], "gpus": 0})
        for name in ("eval", "export")
    ]
    creation.queue(children, lambda job: f"follow-on {job.follow_on_name}", actor="follow-on")
    reasons = JobEvent.objects.filter(job__parent=parent).order_by("job_id")
    assert list(reasons.values_list("reason", flat=True)) == [
        "follow-on eval",
        "follow-on export",
    ]


def test_queue_kicks_the_scheduler_once_after_commit(
    team, alice, kicks, django_capture_on_commit_callbacks
):
    jobs = [
        creation.build(team=team, user=alice, cluster=team.default_cluster, entrypoint=["a"])
        for _ in range(2)
    ]
    with django_capture_on_commit_callbacks(execute=True):
        creation.queue(jobs, "submitted", actor="alice")
        assert kicks == []  # not before the jobs are there to admit
    assert kicks == ["tick"]
