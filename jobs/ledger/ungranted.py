"""Admission's cluster check: a QUEUED job on a cluster its team may no longer use (its grant
was revoked after the job was queued, `jobs.grants`) is stopped with a sentence saying why,
never admitted. The scheduler calls `stop_ungranted` before it admits, on every tick, so a
revoke takes effect however the grant went (the API, `manage.py cluster revoke`, the Django
admin, SQL), and a paused job or an automatic retry that comes back to the queue there is
stopped the same way. Running jobs go on: a revoke ends no work already started.
"""

import datetime as dt
from collections import defaultdict

from jobs import grants
from jobs.ledger.halt import halt
from jobs.states import JobStatus

S = JobStatus


def stop_ungranted(now: dt.datetime) -> list[int]:
    """Stop the QUEUED jobs whose team may not use their cluster; one query when there are
    none, as on almost every tick."""
    by_reason: dict[str, list[int]] = defaultdict(list)
    for job_id, team, cluster in grants.queued_without_grant():
        reason = (
            f"stopped at admission: team {team} may no longer use cluster {cluster} (its "
            "grant was revoked); submit it again on a cluster the team may use"
        )
        by_reason[reason].append(job_id)
    return [
        pk
        for reason, ids in by_reason.items()
        for pk in halt(
            ids, S.STOPPED, reason, actor="scheduler", now=now, expected={S.QUEUED}
        ).halted
    ]
