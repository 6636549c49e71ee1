"""Small builders for ledger rows in tests (setup may place rows in any state directly)."""

import itertools
import threading

from django.db import connections, transaction

from jobs.models import Attempt, ClusterGrant, Job

_runs = itertools.count(1)


def queued_job(team, user, total_gpus: int = 1, **fields) -> Job:
    """A QUEUED job as a submit would have made it: on a cluster its team may use (granted
    here when it is not the team's default), so the scheduler admits it rather than stop it."""
    cluster = fields.pop("cluster", team.default_cluster)
    ClusterGrant.objects.get_or_create(team=team, cluster=cluster)
    return Job.objects.create(
        run_id=f"run{next(_runs):06d}",
        team=team,
        user=user,
        cluster=cluster,
        total_gpus=total_gpus,
        entrypoint=fields.pop("entrypoint", ["true"]),
        **fields,
    )


def place(job: Job, status: str) -> Job:
    """Test setup only: put a job into a state without going through the table."""
    Job.objects.filter(pk=job.pk).update(status=status)
    job.refresh_from_db()
    return job


def with_attempt(job: Job, status: str, **attempt_fields) -> Attempt:
    number = job.attempt_count + 1
    attempt = Attempt.objects.create(
        job=job,
        number=number,
        total_gpus=job.total_gpus,
        backend_name=f"sf-{job.run_id}-a{number}",
        **attempt_fields,
    )
    Job.objects.filter(pk=job.pk).update(attempt_count=number, current_attempt=attempt)
    place(job, status)
    return attempt


class SubmitMeanwhile:
    """A submit from another thread, on its own connection as a web worker's (on SQLite its
    transaction takes the write lock first), given `timeout` seconds to commit."""

    def __init__(self, team, user, timeout: float = 5, **fields) -> None:
        self.job_id: int | None = None
        self._thread = threading.Thread(target=self._submit, args=(team, user, fields))
        self._thread.start()
        self._thread.join(timeout=timeout)
        self.committed = not self._thread.is_alive()

    def _submit(self, team, user, fields: dict) -> None:
        try:
            with transaction.atomic():
                self.job_id = queued_job(team, user, **fields).pk
        finally:
            connections.close_all()

    def join(self) -> None:
        """Wait for the submit, however long it waits for the lock."""
        self._thread.join()
