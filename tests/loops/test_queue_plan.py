"""Queue position and earliest start: the plan on a controllable clock (pure), and the
scheduler tick that makes it, read back through the API, the list and Diagnostics."""

import datetime as dt

import pytest
from django.test import Client
from django.utils import timezone

from jobs.loops.queueplan import ESTIMATE_DEPTH, Holding, Profile, Waiting, plan
from jobs.loops.scheduler import QUEUE_PLAN_EVERY_S, admit_queued_jobs
from jobs.models import Cluster, Job
from jobs.reads.diagnostics import explain
from jobs.reads.queue import queue_places
from jobs.redis_client import client
from jobs.stores import queueplan as store
from jobs.stores.queueplan import PLAN_DEPTH
from tests.factories import queued_job, with_attempt

NOW = 1_000_000.0
C, OTHER = 1, 2  # clusters
A, B = 10, 20  # teams


def waiting(
    job_id: int, total_gpus: int, limit: int | None = None, team: int = A, cluster: int = C
):
    return Waiting(job_id, team, cluster, total_gpus, limit)


def planned(jobs, holdings=(), free=None, room=None, total=8):
    entries, _ = plan(
        jobs,
        holdings,
        capacity={C: total, OTHER: total},
        free=free or {C: total, OTHER: total},
        quota_room=room or {A: 100, B: 100},
        names={C: "gpu", OTHER: "other"},
        now=NOW,
    )
    return entries


# -- the profile -----------------------------------------------------------------------------


def test_a_profile_finds_the_first_window_with_room_for_the_whole_duration():
    profile = Profile(NOW, 2)
    profile.add(NOW + 100, 4)  # 6 free from +100
    profile.add(NOW + 200, -6, NOW + 300)  # 0 free in [+200, +300)
    assert profile.earliest(2, 50, NOW) == NOW
    assert profile.earliest(4, 50, NOW) == NOW + 100
    assert profile.earliest(4, 150, NOW) == NOW + 300  # +100..+250 runs into the gap
    assert profile.earliest(6, None, NOW) == NOW + 300  # for ever: only after the gap
    assert profile.earliest(7, 10, NOW) is None


# -- the plan --------------------------------------------------------------------------------


def test_positions_count_per_cluster_and_per_team_in_the_order_considered():
    jobs = [
        waiting(1, 1, team=A),
        waiting(2, 2, team=B),
        waiting(3, 1, team=A, cluster=OTHER),
        waiting(4, 4, team=A),
    ]
    entries = planned(jobs)
    assert [(entries[i].cluster_position, entries[i].team_position) for i in (1, 2, 3, 4)] == [
        (1, 1),
        (2, 1),
        (1, 2),
        (3, 3),
    ]
    fourth = entries[4]
    assert fourth.ahead == [(2, B, 2), (1, A, 1)]  # the nearest first, its cluster only
    assert (fourth.ahead_jobs, fourth.ahead_gpus) == (2, 3)


def test_the_nearest_five_ahead_are_named_and_every_one_counted():
    entries = planned([waiting(i, 0) for i in range(1, 9)])
    assert [job for job, _, _ in entries[8].ahead] == [7, 6, 5, 4, 3]
    assert entries[8].ahead_jobs == 7


def test_estimates_follow_running_jobs_time_limits_and_plan_backfill():
    # 8 GPUs, all held: 4 until +100, 4 until +300.
    held = [Holding(B, C, 4, NOW + 100), Holding(B, C, 4, NOW + 300)]
    jobs = [waiting(1, 4, limit=50), waiting(2, 8, limit=1000), waiting(3, 4, limit=100)]
    entries = planned(jobs, held, free={C: 0})
    assert entries[1].estimated_start == NOW + 100
    assert entries[2].estimated_start == NOW + 300  # every GPU back only then
    # Fits in the 4 GPUs free from +150 (job 1 done) to +300 (job 2's start): planned before
    # job 2 without delaying it, as backfill would run it.
    assert entries[3].estimated_start == NOW + 150
    assert all(entries[i].no_estimate == "" for i in (1, 2, 3))


def test_a_job_without_a_time_limit_leaves_no_estimate_behind_it():
    held = [Holding(B, C, 8, None)]
    entries = planned([waiting(1, 2, limit=60)], held, free={C: 0})
    assert entries[1].estimated_start is None
    assert entries[1].no_estimate == (
        "cluster gpu's GPUs it needs are held by 1 running or earlier job without a time "
        "limit, so when they come back is unknown"
    )
    # A waiting job without a limit holds what it takes for ever in the plan.
    entries = planned([waiting(1, 8), waiting(2, 1, limit=10)])
    assert entries[1].estimated_start == NOW and entries[2].estimated_start is None


def test_the_teams_quota_is_planned_as_well_as_the_cluster():
    held = [Holding(A, OTHER, 4, NOW + 60)]  # team A's whole quota, on another cluster
    entries = planned([waiting(1, 2, limit=30)], held, room={A: 0, B: 100})
    assert entries[1].estimated_start == NOW + 60


def test_a_gate_time_does_not_open_gives_no_estimate_and_says_which():
    closed = Waiting(1, A, C, 2, 60, blocked="waiting for window nights (opens Mon 20:00 UTC)")
    entries = planned([closed, waiting(2, 2, limit=60)])
    assert entries[1].estimated_start is None
    assert entries[1].no_estimate.startswith("waiting for window nights")
    assert entries[2].estimated_start == NOW  # the blocked job takes nothing in the plan


def test_estimates_stop_at_the_planning_depth_and_say_so():
    entries = planned([waiting(i, 0) for i in range(ESTIMATE_DEPTH + 1)])
    last = entries[ESTIMATE_DEPTH]
    assert last.estimated_start is None and last.cluster_position == ESTIMATE_DEPTH + 1
    assert last.no_estimate == f"more than {ESTIMATE_DEPTH} jobs are ahead of it on cluster gpu"


def test_the_plan_keeps_the_first_jobs_of_each_cluster_and_counts_the_rest():
    jobs = [waiting(i, 0) for i in range(PLAN_DEPTH + 5)] + [waiting(-1, 0, cluster=OTHER)]
    entries, totals = plan(
        jobs, [], {C: 8, OTHER: 8}, {C: 8, OTHER: 8}, {A: 8}, {C: "gpu", OTHER: "o"}, NOW
    )
    assert totals == {C: PLAN_DEPTH + 5, OTHER: 1}
    assert PLAN_DEPTH - 1 in entries and PLAN_DEPTH not in entries
    assert entries[-1].cluster_position == 1
    assert entries[-1].team_position == PLAN_DEPTH + 6  # its team's jobs, kept or not


def test_a_job_larger_than_its_cluster_says_so():
    entries = planned([waiting(1, 16, limit=60)])
    assert entries[1].no_estimate == "cluster gpu has 8 GPUs; this job needs 16"


# -- the tick, read back ---------------------------------------------------------------------


@pytest.fixture
def plan_key(settings):
    conn = client(settings.REDIS_URL)
    conn.delete(store.KEY)
    yield
    conn.delete(store.KEY)


@pytest.mark.django_db
def test_a_tick_places_waiting_jobs_and_the_api_shows_it_to_each_reader_as_they_may_see(
    plan_key, make_team, make_user, api, api_as, team, alice, django_capture_on_commit_callbacks
):
    cluster = Cluster.objects.create(name="four", kind="noop", settings={"gpus": 4})
    other = make_team("nlp", gpu_quota=8, cluster=cluster)
    bob = make_user("bob", other)
    started = timezone.now() - dt.timedelta(seconds=30)
    runner = queued_job(other, bob, total_gpus=4, cluster=cluster, time_limit_s=90)
    with_attempt(runner, "RUNNING", job_ref="r", pending_at=started, start_time=started)
    theirs = queued_job(other, bob, total_gpus=2, cluster=cluster, time_limit_s=600)
    mine = queued_job(team, alice, total_gpus=2, cluster=cluster, time_limit_s=600)
    with django_capture_on_commit_callbacks(execute=True):
        admit_queued_jobs()
    # Fair share offers vision first: nlp holds 4 of its 8 GPUs, vision none.
    body = api.get(f"/jobs/{mine.pk}").json()
    assert (body["queue_position"], body["team_queue_position"], body["ahead_jobs"]) == (1, 1, 0)
    assert body["ahead"] == [] and body["estimate_reason"] == "" and body["planned_at"]
    release = started + dt.timedelta(seconds=90)  # the running job's time limit
    assert at(body["estimated_start"]) == pytest.approx(release.timestamp(), abs=1e-3)
    seen = api_as(bob).get(f"/jobs/{theirs.pk}").json()
    assert (seen["queue_position"], seen["ahead_jobs"], seen["ahead_gpus"]) == (2, 1, 2)
    # vision's: not named
    assert seen["ahead"] == [{"id": None, "same_team": False, "total_gpus": 2, "gpus": 2}]
    assert at(seen["estimated_start"]) == pytest.approx(release.timestamp(), abs=1e-3)
    assert api_as(bob).get(f"/jobs/{runner.pk}").json()["queue_position"] is None
    # The list carries the same places.
    (listed,) = [j for j in api.get("/jobs").json()["items"] if j["id"] == mine.pk]
    assert listed["queue_position"] == 1
    sentences = explain(Job.objects.get(pk=theirs.pk))
    assert (
        "Position 2 among the jobs waiting on cluster four (number 1 of team nlp's); ahead of "
        "it: 1 job asking for 2 GPUs, the nearest another team's job (2 GPUs)."
    ) in sentences
    assert any(s.startswith("Estimated start: by ") for s in sentences)
    console = Client()
    console.force_login(alice)
    page = console.get("/").content.decode()
    assert (
        f'<td class="position" title="estimated start: by {release:%Y-%m-%d %H:%M} UTC">1</td>'
        in page
    )


@pytest.mark.django_db
def test_a_tick_plans_again_only_once_the_kept_plan_is_old_enough(
    plan_key, team, alice, django_capture_on_commit_callbacks
):
    cluster = Cluster.objects.create(name="four", kind="noop", settings={"gpus": 4})
    first = queued_job(team, alice, total_gpus=8, cluster=cluster)  # never fits: it waits

    def tick_and_read(after_s: float) -> tuple[set[int], float | None]:
        with django_capture_on_commit_callbacks(execute=True):
            admit_queued_jobs(start + dt.timedelta(seconds=after_s))
        entries, _, made = store.read([first.pk, second.pk], {cluster.pk})
        return set(entries), made

    start = timezone.now()
    second = first
    assert tick_and_read(0) == ({first.pk}, start.timestamp())
    second = queued_job(team, alice, total_gpus=8, cluster=cluster)
    # A kicked tick soon after keeps the plan it finds: the new job is not placed yet.
    assert tick_and_read(QUEUE_PLAN_EVERY_S - 0.1) == ({first.pk}, start.timestamp())
    later = start.timestamp() + QUEUE_PLAN_EVERY_S
    assert tick_and_read(QUEUE_PLAN_EVERY_S) == ({first.pk, second.pk}, later)


def at(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


@pytest.mark.django_db
def test_a_job_before_any_plan_says_it_is_not_placed_yet(plan_key, api):
    job = api.post("/jobs", {"entrypoint": ["true"]}).json()
    assert job["queue_position"] is None
    assert job["estimate_reason"] == "not placed yet: the scheduler has not planned the queue"


def test_a_job_the_plan_does_not_keep_says_whether_it_is_new_or_further_back(plan_key):
    at = timezone.now()
    store.write({1: planned([waiting(1, 0)])[1].packed()}, {C: 5000}, at.timestamp())
    old = at - dt.timedelta(minutes=5)
    rows = [
        {"id": 1, "status": "QUEUED", "team_id": A, "cluster_id": C, "status_changed_at": old},
        {"id": 2, "status": "QUEUED", "team_id": A, "cluster_id": C, "status_changed_at": old},
        {"id": 3, "status": "QUEUED", "team_id": A, "cluster_id": C,
         "status_changed_at": at + dt.timedelta(seconds=1)},
        {"id": 4, "status": "RUNNING", "team_id": A, "cluster_id": C, "status_changed_at": old},
    ]  # fmt: skip
    places = queue_places(rows, staff=False)
    assert places[1]["queue_position"] == 1
    assert places[2]["queue_position"] is None and places[2]["estimate_reason"] == (
        f"more than {PLAN_DEPTH:,} jobs wait ahead of it on its cluster (5,000 waiting); places "
        f"are kept for the first {PLAN_DEPTH:,}"
    )
    assert places[3]["estimate_reason"].startswith("not placed yet: queued since")
    assert places[4]["queue_position"] is None and places[4]["estimate_reason"] == ""


def test_a_job_shown_again_shows_the_place_of_the_plan_now(plan_key):
    """What a list made of an entry is kept while the entry stays the same, never past it."""
    at = timezone.now().timestamp()
    row = {"id": 3, "status": "QUEUED", "team_id": A, "cluster_id": C,
           "status_changed_at": timezone.now() - dt.timedelta(minutes=5)}  # fmt: skip
    third = planned([waiting(1, 0), waiting(2, 0), waiting(3, 0)])[3].packed()
    store.write({3: third}, {C: 3}, at)
    shown = queue_places([row], staff=False)[3]
    assert (shown["queue_position"], len(shown["ahead"])) == (3, 2)
    assert queue_places([row], staff=False)[3] == shown
    assert {a["id"] for a in queue_places([row], staff=True)[3]["ahead"]} == {1, 2}
    first = planned([waiting(3, 0), waiting(4, 0)])[3].packed()
    store.write({3: first}, {C: 2}, at)  # the same time, another place
    assert queue_places([row], staff=False)[3]["queue_position"] == 1
    store.write({3: first}, {C: 2}, at + 1)
    assert queue_places([row], staff=False)[3]["planned_at"].timestamp() == at + 1


# -- the store: a change sent as a change ----------------------------------------------------


def _entry(position: int) -> dict:
    return planned([waiting(job, 0) for job in range(1, position + 1)])[position].packed()


def _read(job_ids: list[int]) -> dict[int, dict]:
    """The entries read back, with JSON's lists for the tuples they were written with."""
    found = {job: store.unpack(packed) for job, packed in store.read(job_ids, {C})[0].items()}
    return {job: {**e, "a": [tuple(a) for a in e["a"]]} for job, e in found.items()}


def _sent(monkeypatch) -> list[str]:
    """The ways each write reached Redis: "change" (the script) or "whole" (a rename), from a
    process that has written no plan yet."""
    monkeypatch.setattr(store, "_written", store._Written())
    sent: list[str] = []
    changed, replaced = store._changed, store._replace

    def change(*args):
        sent.append("change")
        return changed(*args)

    def whole(*args):
        sent.append("whole")
        return replaced(*args)

    monkeypatch.setattr(store, "_changed", change)
    monkeypatch.setattr(store, "_replace", whole)
    return sent


def test_a_plan_written_again_sends_only_what_changed_and_reads_as_if_written_whole(
    plan_key, monkeypatch, settings
):
    sent = _sent(monkeypatch)
    at = timezone.now().timestamp()
    store.write({1: _entry(1), 2: _entry(2), 3: _entry(3)}, {C: 3}, at)
    store.write({1: _entry(1), 3: _entry(2), 4: _entry(3)}, {C: 3}, at + 1)
    assert sent == ["whole", "change"]
    assert _read([1, 2, 3, 4]) == {1: _entry(1), 3: _entry(2), 4: _entry(3)}  # 2 left, 3 up
    assert store.read([1], {C})[1:] == ({C: 3}, at + 1)
    conn = client(settings.REDIS_URL)
    assert 0 < conn.ttl(store.KEY) <= store.TTL_S


def test_a_plan_another_process_wrote_or_that_expired_is_written_whole(
    plan_key, monkeypatch, settings
):
    sent = _sent(monkeypatch)
    at = timezone.now().timestamp()
    store.write({1: _entry(1), 2: _entry(2)}, {C: 2}, at)
    mine = store._written.version
    # Another worker's tick: its plan, at its own version.
    other = store._written
    store._written = store._Written()
    store.write({5: _entry(1)}, {C: 1}, at + 1)
    store._written = other
    assert store._written.version == mine
    store.write({1: _entry(1), 2: _entry(2)}, {C: 2}, at + 2)  # this process's next tick
    assert sent[-2:] == ["change", "whole"]  # the change found another version
    assert _read([1, 2, 5]) == {1: _entry(1), 2: _entry(2)}
    client(settings.REDIS_URL).delete(store.KEY)  # expired, or flushed
    store.write({1: _entry(1)}, {C: 1}, at + 3)
    assert sent[-2:] == ["change", "whole"]
    assert _read([1, 2]) == {1: _entry(1)} and store.read([1], {C})[1:] == ({C: 1}, at + 3)


def test_a_change_of_thousands_of_entries_applies_whole(plan_key, monkeypatch):
    """Past what one Lua unpack takes (about 8,000 values): every field is sent all the same."""
    sent = _sent(monkeypatch)
    at = timezone.now().timestamp()
    first = {job: {**_entry(1), "c": job} for job in range(1, 9_001)}
    store.write(first, {C: 9_000}, at)
    second = {job: {**_entry(1), "c": job + 1} for job in range(8_901, 14_001)}
    store.write(second, {C: 5_100}, at + 1)  # 8,900 leave, 100 change, 5,000 come
    assert sent == ["whole", "change"]
    found = store.read(list(range(1, 14_001)), {C})
    assert found[0].keys() == second.keys() and found[1] == {C: 5_100}
    assert all(store.unpack(packed)["c"] == job + 1 for job, packed in found[0].items())
