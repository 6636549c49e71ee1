"""`jobs.loops.gates` on plain data: each gate says why a queued job waits, with the numbers, from
a snapshot and what the tick took so far; none reads the database."""

import datetime as dt

from jobs.loops.gates import gate
from jobs.loops.queueplan import Planned
from jobs.loops.reservations import NoRoom
from jobs.loops.tally import Tally
from jobs.windows import parse_window
from tests.loops.plain import NOW, active, cluster, nodes, queued, snapshot, team

VISION = team(1, "vision", quota=4)


def why(snap, job) -> str | None:
    return gate(snap, Tally.start(snap), job)[0]


def test_a_job_within_every_limit_passes_and_a_pool_places_no_ranks():
    job = queued(10, VISION, total_gpus=4)
    snap = snapshot([VISION], [job])
    assert gate(snap, Tally.start(snap), job) == (None, None)


def test_the_team_quota_holds_a_job_with_the_numbers_and_the_plan_models_the_wait():
    job = queued(10, VISION, total_gpus=2)
    snap = snapshot([VISION], [job], [active(1, VISION, total_gpus=3)])
    reason = why(snap, job)
    assert reason == "waiting for quota: team vision uses 3 of 4 GPUs; this job needs 2"
    assert isinstance(reason, Planned)


def test_the_teams_slots_hold_a_job_before_its_gpus_are_counted():
    slots = team(2, "nlp", quota=8, max_jobs=1)
    job = queued(10, slots)
    snap = snapshot([slots], [job], [active(1, slots)])
    assert why(snap, job) == "waiting for a slot: team nlp runs 1 of the 1 jobs it may run at once"


def test_a_member_cap_holds_one_member_and_not_another():
    capped = team(2, "nlp", quota=8, user_gpu_cap=2)
    first, second = (
        queued(10, capped, total_gpus=2, user=1),
        queued(11, capped, total_gpus=2, user=2),
    )
    snap = snapshot([capped], [first, second], [active(1, capped, total_gpus=1, user=1)])
    assert why(snap, first) == (
        "waiting for quota: user1 uses 1 of the 2 GPUs team nlp allows one member; this job needs 2"
    )
    assert why(snap, second) is None


def test_a_closed_window_says_when_it_opens_and_comes_before_the_quota():
    nights = parse_window("mon-fri 20:00-08:00", "UTC", "nights")
    job = queued(10, VISION, total_gpus=9, window=5)
    snap = snapshot([VISION], [job], windows={5: nights})
    assert why(snap, job) == "waiting for window nights (opens Wed 20:00 UTC)"


def test_a_used_up_budget_holds_gpu_jobs_and_not_cpu_jobs():
    budgeted = team(2, "nlp", gpu_hours_per_month=1)
    gpu_job, cpu_job = queued(10, budgeted, total_gpus=1), queued(11, budgeted, total_gpus=0)
    snap = snapshot([budgeted], [gpu_job, cpu_job], month_us={2: 3600 * 1_000_000})
    assert why(snap, gpu_job) == (
        "waiting for budget: team nlp used 1.0 of its 1 GPU-hours this month; "
        "the budget renews Jan 1 00:00 UTC"
    )
    assert why(snap, cpu_job) is None


def test_an_arrays_max_parallel_holds_its_next_task():
    task = queued(10, VISION, array=3, array_cap=2)
    assert why(snapshot([VISION], [task], array_tasks={3: 1}), task) is None
    assert why(snapshot([VISION], [task], array_tasks={3: 2}), task) == (
        "waiting for its array: at most 2 of array 3's tasks run at once (--max-parallel)"
    )


def test_a_full_cluster_is_no_room_the_wait_a_reservation_is_made_for():
    job = queued(10, VISION, total_gpus=2)
    snap = snapshot([VISION], [job], clusters=[cluster(gpus=1)])
    reason = why(snap, job)
    assert reason == "waiting for capacity: cluster gpu has 1 of 1 GPUs free; this job needs 2"
    assert isinstance(reason, NoRoom)


def test_a_disabled_or_unreachable_cluster_holds_the_job():
    job = queued(10, VISION)
    assert why(snapshot([VISION], [job], clusters=[cluster(pk=8)]), job) == (
        "waiting for capacity: the job's cluster is disabled"
    )
    down = cluster(reachable=False, message="timed out")
    assert why(snapshot([VISION], [job], clusters=[down]), job) == (
        "waiting for cluster gpu: it cannot be reached (timed out)"
    )


def test_a_teams_share_of_a_cluster_caps_it_there():
    job = queued(10, VISION, total_gpus=2)
    snap = snapshot([VISION], [job], [active(1, VISION)], shares={(1, 7): 10})
    assert why(snap, job) == (
        "waiting for share: team vision holds 1 of its 1 GPUs on cluster gpu (10% of 16); "
        "this job needs 2"
    )


def test_a_gang_needs_a_node_with_room_for_every_rank_not_a_cluster_sum():
    big = team(2, "nlp", quota=16)
    gang = queued(10, big, total_gpus=4, nodes=2)
    snap = snapshot(
        [big], [gang], [active(1, big, total_gpus=1, ranks=[{"node": "a"}])],
        clusters=[nodes(("a", 2, ""), ("b", 2, ""), ("c", 1, ""))],
    )  # fmt: skip
    assert (
        why(snap, gang)
        == "waiting for 2 nodes with 2 free GPUs each: 1 such node free on cluster gpu"
    )
    roomy = snapshot([big], [gang], clusters=[nodes(("a", 2, ""), ("b", 2, ""))])
    assert gate(roomy, Tally.start(roomy), gang) == (None, ["a", "b"])


def test_a_capped_gpu_type_holds_a_job_that_asks_for_it():
    capped = team(2, "nlp", quota=16)
    job = queued(10, capped, total_gpus=2, gpu_type="a100")
    snap = snapshot(
        [capped],
        [job],
        [active(1, capped, total_gpus=3, gpu_type="a100")],
        type_caps={2: {"a100": 4}},
    )
    assert (
        why(snap, job) == "waiting for quota: team nlp uses 3 of its 4 a100 GPUs; this job needs 2"
    )


def test_gates_read_the_snapshots_clock():
    nights = parse_window("mon-fri 20:00-08:00", "UTC", "nights")
    job = queued(10, VISION, window=5)
    later = snapshot([VISION], [job], windows={5: nights}, now=NOW + dt.timedelta(hours=9))
    assert why(later, job) is None
