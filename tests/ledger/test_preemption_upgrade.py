"""The upgrade to one preemption flag (migration 0031): every job the old `paused_by_preemption`
marked is still the preemption's to queue again, no other is, and going back marks them again."""

import datetime as dt

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from jobs.reads.preemption import PAUSED_REASON, paused_jobs

BEFORE = ("jobs", "0030_cluster_grants")
ONE_FLAG = ("jobs", "0031_preemption_one_flag")
T0 = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)


def migrate(to: tuple[str, str]):
    executor = MigrationExecutor(connection)
    executor.migrate([to])
    return executor.loader.project_state([to]).apps


@pytest.mark.django_db(transaction=True)
def test_the_upgrade_keeps_what_the_old_flag_said():
    old = migrate(BEFORE)
    job_model, attempt_model = old.get_model("jobs", "Job"), old.get_model("jobs", "Attempt")
    cluster = old.get_model("jobs", "Cluster").objects.create(name="gpu", kind="noop")
    team = old.get_model("jobs", "Team").objects.create(name="vision", default_cluster=cluster)
    user = old.get_model("auth", "User").objects.create(username="vic")

    def paused(name: str, reason: str, flagged: bool, notice: dt.datetime | None):
        job = job_model.objects.create(
            run_id=name, team=team, user=user, cluster=cluster, entrypoint=["a"], status="PAUSED",
            status_reason=reason, paused_by_preemption=flagged, attempt_count=1,
        )  # fmt: skip
        attempt = attempt_model.objects.create(
            job=job, number=1, gpus=1, backend_name=name, submitted_at=T0, end_time=T0,
            preempted_at=notice,
        )  # fmt: skip
        job_model.objects.filter(pk=job.pk).update(current_attempt=attempt)
        return job.pk

    preempted = paused("a", PAUSED_REASON, True, T0)
    unmarked = paused("b", "preempted", True, None)  # flagged with what the rule needs missing
    persons = paused("c", "paused by vic", False, T0)  # a person's pause during the notice
    migrate(ONE_FLAG)
    assert paused_jobs() == [preempted, unmarked]
    assert paused_jobs([persons]) == []
    old = migrate(BEFORE)
    flagged = old.get_model("jobs", "Job").objects.filter(paused_by_preemption=True)
    assert sorted(flagged.values_list("pk", flat=True)) == [preempted, unmarked]
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes("jobs"))
