"""A new job: the one way a `Job` row is built and written with its first event, whoever makes
it: a submission (`jobs.actions.submit`), the tasks of an array (`jobs.actions.arrays`) and a
follow-on of a job that succeeded (`jobs.ledger.lifecycle`).

`build` gives a job its run id and its waiting reason; `follow_on` builds a follow-on from what
its parent asked for; `queue` writes the jobs and the first QUEUED event of each in the
caller's transaction, and kicks the scheduler once it commits. Nothing else creates a job
(`tests/structure/test_rows_have_one_door.py`).
"""

import secrets
from collections.abc import Callable, Sequence
from typing import Any

from django.db import transaction

from jobs import kick
from jobs.gpus import to_total_gpus
from jobs.models import Job, JobEvent
from jobs.states import JobStatus

WAITING = "waiting for the scheduler's next tick"
# What a job asks for besides its command and its GPUs: a follow-on asks the same as its
# parent (its team, cluster, resources per node, image, environment, snapshot, window,
# retries and limits), so it runs as its parent ran.
INHERITED = (
    "team",
    "user",
    "cluster",
    "cpus",
    "memory_mb",
    "image",
    "env",
    "snapshot",
    "priority",
    "window",
    "window_policy",
    "pending_deadline_s",
    "max_retries",
    "retry_cooldown_s",
    "time_limit_s",
)
BATCH = 1000  # rows a bulk insert sends at once: an array of 10,000 tasks in ten


def build(**fields: Any) -> Job:
    """A new job of `fields` (unsaved), with a run id of its own and waiting for the scheduler."""
    return Job(run_id=secrets.token_hex(8), status_reason=WAITING, **fields)


def follow_on(parent: Job, name: str, spec: dict) -> Job:
    """The follow-on `name` of `parent` (unsaved): what the parent asked for, with the
    command and GPUs of its `[then.NAME]` table (`spec`, checked and normalised at submit),
    on one node. A follow-on with GPUs asks for its parent's GPU type; one without asks for
    none, as submit allows no GPU type without GPUs."""
    return build(
        **{field: getattr(parent, field) for field in INHERITED},
        name=f"{parent.name[:150]} → {name}",
        entrypoint=spec["entrypoint"],
        total_gpus=to_total_gpus(spec["gpus"], nodes=1),  # `[then.NAME] gpus` are per node
        gpu_type=parent.gpu_type if spec["gpus"] else "",
        parent=parent,
        follow_on_name=name,
    )


def queue(jobs: Sequence[Job], reason: str | Callable[[Job], str], *, actor: str) -> list[Job]:
    """Write `jobs` and the first event of each (QUEUED, `reason` or the reason it gives the
    job, by `actor`) in the caller's transaction, in a few statements however many; the
    scheduler is kicked once, after commit."""
    made = Job.objects.bulk_create(jobs, batch_size=BATCH)
    JobEvent.objects.bulk_create(
        [
            JobEvent(
                job_id=job.pk,
                kind=JobEvent.Kind.STATUS,
                to_status=JobStatus.QUEUED,
                reason=reason if isinstance(reason, str) else reason(job),
                actor=actor,
            )
            for job in made
        ],
        batch_size=BATCH,
    )
    transaction.on_commit(kick.scheduler)
    return made
