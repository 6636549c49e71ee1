"""`jobs.loops.admission.decide` on plain data: the queue offered in fair-share order through the
gates, what each admission takes counted for the jobs after it, waiting reasons kept only where
they changed, and the tick's bound on admissions; it reads and writes nothing."""

from jobs.loops.admission import decide
from tests.loops.plain import active, cluster, queued, snapshot, team

VISION, NLP = team(1, "vision", quota=2), team(2, "nlp", quota=2)


def admitted(decided) -> list[int]:
    return [job for job, *_ in decided.admit]


def test_each_admission_counts_against_the_quota_of_the_jobs_after_it():
    jobs = [queued(10 + n, VISION) for n in range(3)]
    decided = decide(snapshot([VISION], jobs), limit=100)
    assert admitted(decided) == [10, 11]
    assert dict(decided.reasons) == {
        "waiting for quota: team vision uses 2 of 2 GPUs; this job needs 1": [12]
    }
    assert [w.id for w in decided.waiting] == [12]


def test_the_team_that_used_less_is_offered_the_gpus_first():
    jobs = [queued(10, VISION), queued(20, NLP)]
    used = {VISION.pk: 10 * 3600 * 10**6}  # 10 GPU-hours this week
    assert admitted(decide(snapshot([VISION, NLP], jobs, recent_us=used), limit=100)) == [20, 10]
    one_gpu = snapshot([VISION, NLP], jobs, clusters=[cluster(gpus=1)], recent_us=used)
    assert admitted(decide(one_gpu, limit=100)) == [20]


def test_a_reason_that_did_not_change_is_not_written_again():
    old = "waiting for quota: team vision uses 2 of 2 GPUs; this job needs 1"
    waiting = queued(10, VISION, old_reason=old)
    decided = decide(snapshot([VISION], [waiting], [active(1, VISION, total_gpus=2)]), limit=100)
    assert decided.admit == [] and dict(decided.reasons) == {}
    assert [w.id for w in decided.waiting] == [10]  # still planned


def test_a_tick_stops_at_its_bound_and_leaves_the_plan_to_the_next():
    jobs = [queued(10 + n, VISION) for n in range(2)]
    decided = decide(snapshot([VISION], jobs), limit=1)
    assert admitted(decided) == [10]
    assert decided.considered_all is False


def test_the_admission_event_keeps_the_teams_own_figures_with_the_job():
    decided = decide(snapshot([VISION], [queued(10, VISION)], [active(1, VISION)]), limit=100)
    [(_, total_gpus, lender, record)] = decided.admit
    assert (total_gpus, lender) == (1, None)
    assert record == {
        "team_gpus": 2,
        "team_jobs": 2,
        "member_gpus": 2,
        "gpu_quota": 2,
        "max_jobs": None,
        "user_gpu_cap": None,
    }


def test_a_job_past_its_quota_borrows_a_lendable_teams_idle_gpus_and_says_so():
    lab = team(3, "lab", quota=8, lendable=True)
    borrower = team(4, "vision", quota=0, borrow_cap=4)
    decided = decide(snapshot([lab, borrower], [queued(10, borrower, total_gpus=2)]), limit=100)
    [(_, _, lender, record)] = decided.admit
    assert lender == lab.pk
    assert record["borrowed"] is True and record["borrowed_gpus"] == 2
    assert decided.tally.held.lent[lab.pk] == 2
