"""`jobs.loops.reservations` on plain data: the reservation the first job without room gets,
which jobs may pass it (backfill), and what active jobs and this tick's admissions hold until
when. The scenarios through whole ticks are tests/loops/test_reservations.py."""

import datetime as dt

from jobs.loops.queueplan import Holding
from jobs.loops.reservations import Backfill, NoRoom, active_holdings
from tests.loops.plain import NOW, active, cluster, queued, snapshot, team

VISION = team(1, "vision", quota=8)
LAB = team(2, "lab", quota=8, lendable=True)
T = NOW.timestamp()


def reserved(running: list, big, **fields) -> Backfill:
    """A backfill on an 8-GPU cluster where `running` hold their GPUs and `big` found no room."""
    snap = snapshot([VISION, LAB], [big], running, clusters=[cluster(gpus=8)], **fields)
    backfill = Backfill(snap)
    backfill.reserve(big, held_gpus=sum(job.total_gpus for job in running))
    return backfill


def test_the_reservation_starts_when_enough_gpus_come_back():
    ends_soon = active(
        1, VISION, total_gpus=4, time_limit_s=3600, started=NOW - dt.timedelta(minutes=50)
    )
    forever = active(2, VISION, total_gpus=3)
    backfill = reserved([ends_soon, forever], queued(10, VISION, total_gpus=4))
    assert backfill.reservations[7].start == T + 600


def test_a_job_done_before_the_reserved_start_passes_and_a_longer_one_waits():
    ends_soon = active(
        1, VISION, total_gpus=4, time_limit_s=3600, started=NOW - dt.timedelta(minutes=50)
    )
    backfill = reserved(
        [ends_soon, active(2, VISION, total_gpus=3)], queued(10, VISION, total_gpus=4)
    )
    assert backfill.reserved_for_another(queued(11, VISION, total_gpus=2, time_limit_s=600)) is None
    assert backfill.reserved_for_another(queued(12, VISION, total_gpus=1, time_limit_s=601)) is None
    why = backfill.reserved_for_another(queued(13, VISION, total_gpus=2, time_limit_s=601))
    assert isinstance(why, NoRoom)
    assert why == (
        "waiting for reserved GPUs: cluster gpu's GPUs are reserved from 2026-12-02 12:10 UTC for "
        "a job that waited longer (4 GPUs); this job's time limit would run past that"
    )


def test_a_job_without_a_time_limit_passes_only_a_young_reservation(settings):
    settings.SF_RESERVE_AGE_S = 900
    ends_soon = active(
        1, VISION, total_gpus=4, time_limit_s=3600, started=NOW - dt.timedelta(minutes=50)
    )
    running = [ends_soon, active(2, VISION, total_gpus=3)]
    young = reserved(running, queued(10, VISION, total_gpus=4, queued_at=NOW))
    old = reserved(running, queued(10, VISION, total_gpus=4, queued_at=NOW - dt.timedelta(hours=1)))
    assert young.reserved_for_another(queued(11, VISION, total_gpus=2)) is None
    assert old.reserved_for_another(queued(11, VISION, total_gpus=2)) == (
        "waiting for reserved GPUs: cluster gpu's GPUs are reserved from 2026-12-02 12:10 UTC for "
        "a job that waited longer (4 GPUs), and a job without a time limit may not pass a job "
        "that has waited more than 15 min"
    )


def test_a_preempted_job_holds_its_gpus_until_its_grace_and_borrowed_ones_count_for_the_lender():
    notice = NOW - dt.timedelta(seconds=30)
    borrower = active(1, VISION, total_gpus=2, lender=LAB.pk, preempted=notice)
    told_now = active(2, VISION, total_gpus=1, attempt=77)
    snap = snapshot([VISION, LAB], [], [borrower, told_now])
    grace = snap.grace_s(7)
    assert active_holdings(snap) == [
        Holding(LAB.pk, 7, 2, notice.timestamp() + grace),
        Holding(VISION.pk, 7, 1, None),
    ]
    # This tick's notice: as the ledger will say once the tick has written it.
    assert active_holdings(snap, told={77})[1] == Holding(VISION.pk, 7, 1, T + grace)


def test_an_admission_holds_its_gpus_until_its_limit_against_its_lender():
    backfill = Backfill(snapshot([VISION, LAB]))
    backfill.took(queued(10, VISION, total_gpus=2, time_limit_s=60), lender=LAB.pk)
    backfill.took(queued(11, VISION, total_gpus=0), lender=None)  # no GPUs: holds nothing
    assert [(h.team, h.total_gpus, h.until) for h in backfill.admitted] == [(LAB.pk, 2, T + 60)]
