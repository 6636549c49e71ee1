"""SDK metrics on the server: ingest (POST /api/v1/ingest/metrics), series with LTTB, latest."""

import importlib
import math

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext

from jobs.models import MetricChunk, MetricRollup, MetricSeries
from jobs.stores.metrics.charts import keep_extremes, latest, lttb, series
from jobs.stores.metrics.chunks import chunk, stored_points, write_chunks
from jobs.stores.metrics.ingest import append
from jobs.stores.metrics.rollups import BUCKET_LIMIT, LEVELS, aggregate
from tests.api_helpers import assert_refused, submit
from tests.ingesting import T0, attach_attempt, finish, make_points, runner, send_points
from tests.ingesting import send_metrics as send
from tests.stores.metric_rows import from_scratch, rollups, series_rows

pytestmark = pytest.mark.django_db


def stored(job_id: int) -> list[tuple]:
    return stored_points(job_id)


@pytest.fixture
def job_id(api) -> int:
    """A RUNNING job whose current attempt is 1."""
    job_id = submit(api)
    attach_attempt(job_id, 1)
    return job_id


# -- ingest ----------------------------------------------------------------------------------------


def test_a_batch_is_stored_and_counted(job_id):
    response = send_points(runner(job_id), make_points(0, 3))
    assert response.status_code == 200, response.content
    assert response.json() == {"accepted": 3, "duplicates": 0, "dropped": 0}
    assert stored(job_id)[1] == (1, 1, "train", "loss", 1, 0.5, T0 + 1)


def test_a_resent_batch_is_not_stored_twice(job_id):
    client = runner(job_id)
    send_points(client, make_points(0, 3))
    assert send_points(client, make_points(0, 3)).json() == {
        "accepted": 0,
        "duplicates": 3,
        "dropped": 0,
    }
    assert send_points(client, make_points(2, 5)).json() == {
        "accepted": 2,
        "duplicates": 1,
        "dropped": 0,
    }
    assert [row[1] for row in stored(job_id)] == [0, 1, 2, 3, 4]


def test_a_point_repeated_inside_one_batch_is_stored_once(job_id):
    point = make_points(0, 1)[0]
    assert send_points(runner(job_id), [point, point]).json() == {
        "accepted": 1,
        "duplicates": 1,
        "dropped": 0,
    }
    assert len(stored(job_id)) == 1


def test_seq_numbers_are_per_attempt(job_id):
    send_points(runner(job_id), make_points(0, 2))
    attach_attempt(job_id, 2)
    assert send_points(runner(job_id, 2), make_points(0, 2), attempt=2).json()["accepted"] == 2
    assert [row[:2] for row in stored(job_id)] == [(1, 0), (1, 1), (2, 0), (2, 1)]


def test_an_empty_batch_is_fine(job_id):
    assert send_points(runner(job_id), []).json() == {"accepted": 0, "duplicates": 0, "dropped": 0}


@pytest.mark.parametrize(
    "change",
    [
        {"seq": -1},
        {"seq": 1.0},
        {"kind": "eval"},
        {"name": ""},
        {"name": "x" * 101},
        {"name": 5},
        {"step": -3},
        {"step": 2**63},
        {"value": True},
        {"value": "0.5"},
        {"value": None},
        {"ts": "yesterday"},
    ],
)
def test_a_batch_with_a_bad_point_is_400_and_stores_nothing(job_id, change):
    points = make_points(0, 3)
    points[2] = {**points[2], **change}
    body = assert_refused(send_points(runner(job_id), points), 400, "point 2 must have")
    assert "finite numbers" in body["detail"]
    assert stored(job_id) == []


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_values_are_400(job_id, constant):
    raw = (
        '{"attempt": 1, "points": [{"seq": 0, "kind": "train", "name": "loss", "step": 0, '
        f'"value": {constant}, "ts": {T0}}}]}}'
    )
    assert_refused(send(runner(job_id), raw), 400, "point 0")
    assert stored(job_id) == []


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("{not json", "not JSON"),
        ([], '"attempt": 1'),
        ({"attempt": 2, "points": []}, '"attempt": 1'),
        ({"attempt": 1}, '"points" must be a list'),
        ({"attempt": 1, "points": {"seq": 0}}, '"points" must be a list'),
    ],
)
def test_a_malformed_body_is_400(job_id, body, fragment):
    assert_refused(send(runner(job_id), body), 400, fragment)


def test_a_batch_over_the_point_cap_is_413(job_id, settings):
    settings.SF_METRIC_BATCH_MAX_POINTS = 5
    assert_refused(send_points(runner(job_id), make_points(0, 6)), 413, "at most 5 points")
    assert stored(job_id) == []
    assert send_points(runner(job_id), make_points(0, 5)).json()["accepted"] == 5


def test_a_job_finished_longer_than_the_grace_ago_is_410(job_id):
    finish(job_id, "SUCCEEDED", seconds_ago=121)
    assert_refused(send_points(runner(job_id), make_points(0, 1)), 410, "closed")
    assert stored(job_id) == []


def test_a_job_that_just_finished_still_accepts_its_last_points(job_id):
    finish(job_id, "FAILED", seconds_ago=5)
    assert send_points(runner(job_id), make_points(0, 1)).json()["accepted"] == 1


def test_a_token_of_a_superseded_attempt_is_410(job_id):
    attach_attempt(job_id, 2)
    assert_refused(send_points(runner(job_id, 1), make_points(0, 1)), 410, "attempt 1")
    assert stored(job_id) == []


def test_a_token_of_another_job_writes_only_its_own_job(api, job_id):
    other = submit(api)
    attach_attempt(other, 1)
    assert send_points(runner(other), make_points(0, 2)).json()["accepted"] == 2
    assert stored(job_id) == [] and len(stored(other)) == 2


def test_deleting_the_job_deletes_its_points_and_leaves_another_jobs_alone(api, job_id):
    """MetricChunk.job has no constraint in the database: the ORM's delete must remove them."""
    other = submit(api)
    attach_attempt(other, 1)
    assert send_points(runner(job_id), make_points(0, 5)).status_code == 200
    assert send_points(runner(other), make_points(0, 3)).status_code == 200
    finish(job_id)
    assert api.client.delete(f"/api/v1/jobs/{job_id}").status_code == 204
    assert stored(job_id) == []
    assert not MetricSeries.objects.filter(job_id=job_id).exists()
    assert not MetricRollup.objects.filter(job_id=job_id).exists()
    assert [seq for _, seq, *_ in stored(other)] == [0, 1, 2]


@pytest.mark.postgres
def test_the_resend_check_reads_the_seq_index_while_the_job_looks_empty(api, job_id):
    """Planned with the statistics of a job that had no points yet, the check must still probe
    (job, attempt, last_seq), not filter every chunk of the job through the series index."""
    other = submit(api)
    attach_attempt(other, 1)
    # Enough chunks that reading the table whole costs more than an index probe.
    chunks = [chunk("train", f"m{seq % 50}", [seq], [seq], [0.5], [T0]) for seq in range(5000)]
    write_chunks(other, 1, chunks)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {MetricChunk._meta.db_table}")
    with CaptureQueriesContext(connection) as queries:
        append(job_id, 1, make_points(0, 2000))
    (check,) = [
        q["sql"]
        for q in queries
        if q["sql"].startswith('SELECT SUBSTRING("jobs_metricchunk"."points"')
    ]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {check}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "using metric_chunk_seqs" in plan and "Seq Scan" not in plan, plan


def test_a_user_token_cannot_ingest(api, job_id):
    response = api.client.post(
        "/api/v1/ingest/metrics",
        {"attempt": 1, "points": make_points(0, 1)},
        content_type="application/json",
    )
    assert_refused(response, 401)
    assert stored(job_id) == []


# -- reading ---------------------------------------------------------------------------------------


def read(api, job_id: int, **params) -> dict:
    response = api.get(f"/jobs/{job_id}/metrics", **params)
    assert response.status_code == 200, response.content
    return response.json()


def test_the_api_returns_each_series_and_the_latest_values(api, job_id):
    client = runner(job_id)
    send_points(client, make_points(0, 3) + make_points(3, 5, name="lr"))
    send_points(client, make_points(5, 6, name="accuracy", kind="validation"))
    body = read(api, job_id)
    assert body["series"] == {
        "loss": {"x": [0, 1, 2], "y": [1.0, 0.5, 1 / 3], "total": 3, "downsampled": False},
        "lr": {"x": [3, 4], "y": [0.25, 0.2], "total": 2, "downsampled": False},
    }
    assert body["latest"]["loss"] == {"step": 2, "value": 1 / 3, "ts": T0 + 2}
    validation = read(api, job_id, kind="validation", x="time")
    assert validation["series"]["accuracy"]["x"] == [T0 + 5]
    assert validation["latest"] == {"accuracy": {"step": 5, "value": 1 / 6, "ts": T0 + 5}}


def test_a_job_without_metrics_has_empty_series(api, job_id):
    assert read(api, job_id) == {"series": {}, "latest": {}}


@pytest.mark.parametrize(
    "params",
    [{"kind": "eval"}, {"x": "wall"}, {"max_points": 1}, {"max_points": 10_001}],
)
def test_bad_read_parameters_are_422(api, job_id, params):
    assert_refused(api.get(f"/jobs/{job_id}/metrics", **params), 422)


def test_metrics_of_another_team_are_404(api_as, make_team, make_user, job_id):
    send_points(runner(job_id), make_points(0, 1))
    stranger = api_as(make_user("carol", make_team("audio")))
    assert_refused(stranger.get(f"/jobs/{job_id}/metrics"), 404)


def test_a_job_token_cannot_read_metrics(job_id):
    assert_refused(runner(job_id).get(f"/api/v1/jobs/{job_id}/metrics"), 401)


def test_series_of_100k_points_comes_back_as_max_points(job_id):
    for start in range(0, 100_000, 20_000):
        append(job_id, 1, make_points(start, start + 20_000))
    loss = series(job_id, "train", max_points=2000)["loss"]
    assert (loss["total"], loss["downsampled"], len(loss["x"]), len(loss["y"])) == (
        100_000,
        True,
        2000,
        2000,
    )
    assert (loss["x"][0], loss["x"][-1]) == (0, 99_999)
    assert loss["x"] == sorted(loss["x"]) and loss["y"][0] == 1.0
    by_time = series(job_id, "train", x="time", max_points=500)["loss"]
    assert len(by_time["x"]) == 500 and by_time["x"][-1] == T0 + 99_999


def test_series_orders_by_step_across_attempts_and_time_by_ts(job_id):
    append(job_id, 1, [{**p, "step": 10 - p["seq"]} for p in make_points(0, 3)])
    assert series(job_id, "train")["loss"]["x"] == [8, 9, 10]
    assert series(job_id, "train", x="time")["loss"]["x"] == [T0, T0 + 1, T0 + 2]


def test_latest_takes_the_highest_step_and_the_newest_attempt_at_a_tie(job_id):
    append(job_id, 1, make_points(0, 4))
    resumed = [{**make_points(0, 1)[0], "step": 3, "value": 7.0}]
    append(job_id, 2, resumed)
    assert latest(job_id, "train") == {"loss": {"step": 3, "value": 7.0, "ts": T0}}
    assert latest(job_id, "validation") == {}


# -- rollups --------------------------------------------------------------------------------------


def test_rollups_count_each_point_once_across_resends(job_id):
    client = runner(job_id)
    both = lambda a, b: make_points(a, b) + make_points(a + 10_000, b + 10_000, name="lr")  # noqa: E731
    send_points(client, both(0, 300))
    assert send_points(client, both(0, 300)).json()["accepted"] == 0
    assert send_points(client, both(200, 700)).json()["accepted"] == 800
    append(job_id, 1, both(650, 900) + both(650, 700))  # repeats inside the batch too
    attach_attempt(job_id, 2)
    append(job_id, 2, [{**p, "step": p["step"] + 5} for p in make_points(0, 400)])
    raw = sum(1 for p in stored_points(job_id) if p[2:4] == ("train", "loss"))
    assert raw == 900 + 400
    assert series_rows(job_id)[("train", "loss")] == [raw, 0, 899, T0, T0 + 899]
    stored = rollups(job_id)
    for axis in ("step", "time"):
        for level in LEVELS:
            counts = [acc[0] for key, acc in stored.items() if key[1:4] == ("loss", axis, level)]
            assert sum(counts) == raw, (axis, level)
    stats, expected = from_scratch(job_id)
    assert stored == expected
    assert series_rows(job_id) == stats


@pytest.mark.django_db(transaction=True)
def test_the_migrations_move_points_into_chunks_and_back_and_rebuild_the_same_rollups(job_id):
    """0022 packs the points stored one row each into chunks (and unpacks them going back);
    0005's backfill of the rollups, run over those rows, gives the rollups ingest kept."""
    append(job_id, 1, make_points(0, 3000) + make_points(3000, 3100, name="lr"))
    attach_attempt(job_id, 2)
    append(job_id, 2, make_points(0, 10))
    before = stored(job_id), rollups(job_id), series_rows(job_id)
    per_point = [("jobs", "0021_log_objects_swept")]
    executor = MigrationExecutor(connection)
    executor.migrate(per_point)
    old = executor.loader.project_state(per_point).apps
    rows = old.get_model("jobs", "MetricPoint").objects.order_by("attempt", "seq")
    assert (
        list(rows.values_list("attempt", "seq", "kind", "name", "step", "value", "ts")) == before[0]
    )
    old.get_model("jobs", "MetricRollup").objects.all().delete()
    old.get_model("jobs", "MetricSeries").objects.all().delete()
    importlib.import_module("jobs.migrations.0005_metric_rollups").build_rollups(old, None)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes("jobs"))
    assert (stored(job_id), rollups(job_id), series_rows(job_id)) == before
    # loss in two chunks of at most 2,000 points, lr, and attempt 2's loss
    assert MetricChunk.objects.filter(job_id=job_id).count() == 4


def spiky_points(n: int) -> list[dict]:
    points = make_points(0, n)
    for p in points:
        p["value"] = math.sin(p["step"] / 300) + (p["step"] % 13) / 50
    points[31_337]["value"] = 1_000.0
    points[77_777]["value"] = -1_000.0
    return points


def test_a_long_series_is_read_from_the_rollups_only(job_id):
    points = spiky_points(100_000)
    for start in range(0, 100_000, 20_000):
        append(job_id, 1, points[start : start + 20_000])
    append(job_id, 1, [{**p, "seq": p["seq"] + 10**6} for p in make_points(0, 5, "lr")])
    for x, first, last in (("step", 0, 99_999), ("time", T0, T0 + 99_999)):
        with CaptureQueriesContext(connection) as queries:
            got = series(job_id, "train", x=x, max_points=2000)
        point_reads = [q["sql"] for q in queries if MetricChunk._meta.db_table in q["sql"]]
        # Only the short series is read point by point.
        assert len(point_reads) == 1 and "'lr'" in point_reads[0], point_reads
        assert "'loss'" not in point_reads[0]
        loss = got["loss"]
        assert (loss["total"], loss["downsampled"], len(loss["x"]), len(loss["y"])) == (
            100_000,
            True,
            2000,
            2000,
        )
        assert (loss["x"][0], loss["x"][-1]) == (first, last)
        assert (loss["y"][0], loss["y"][-1]) == (points[0]["value"], points[-1]["value"])
        assert loss["x"] == sorted(set(loss["x"]))
        assert (31_337 + (T0 if x == "time" else 0)) in loss["x"]
        assert 1_000.0 in loss["y"] and -1_000.0 in loss["y"]
        assert got["lr"]["total"] == 5 and not got["lr"]["downsampled"]
    assert isinstance(got["loss"]["x"][1], float)
    by_step = series(job_id, "train", max_points=500)["loss"]
    assert len(by_step["x"]) == 500 and all(type(v) is int for v in by_step["x"])


def test_a_sparse_long_series_still_comes_back_as_max_points(job_id):
    # 2,900 points crowded at the start and one far away: the coarse buckets are too few.
    points = make_points(0, 2901)
    points[-1]["step"] = 10**9
    append(job_id, 1, points)
    loss = series(job_id, "train", max_points=2000)["loss"]
    assert (loss["total"], len(loss["x"]), loss["x"][0], loss["x"][-1]) == (2901, 2000, 0, 10**9)


def test_keep_extremes_swaps_in_the_lowest_and_highest_points():
    ys = [0.0, 1.0, 9.0, 1.0, 0.0, -9.0, 0.0, 1.0]
    assert keep_extremes([0, 1, 3, 7], ys) == [0, 2, 5, 7]
    assert keep_extremes([0, 2, 5, 7], ys) == [0, 2, 5, 7]


# -- LTTB ------------------------------------------------------------------------------------------


def test_lttb_returns_short_input_unchanged():
    assert lttb([0, 1, 2], [5.0, 1.0, 3.0], 3) == [0, 1, 2]
    assert lttb([0, 1], [5.0, 1.0], 10) == [0, 1]
    assert lttb([], [], 10) == []


def test_lttb_with_one_bucket_keeps_the_peak():
    # Buckets: [1, 2, 3]; next-bucket average is the last point (4, 0). Triangle areas with
    # (0, 0) and (4, 0) are 2 * y: 2, 10, 2 -> index 2 wins.
    assert lttb([0, 1, 2, 3, 4], [0, 1, 5, 1, 0], 3) == [0, 2, 4]


def test_lttb_by_hand_with_two_buckets():
    # n = 8, threshold 4: every = 6 / 2 = 3, buckets [1, 2, 3] and [4, 5, 6].
    xs = [0, 1, 2, 3, 4, 5, 6, 7]
    ys = [0, 4, 1, 2, 9, 0, 3, 1]
    # Bucket 1: a = (0, 0), next average = ((4+5+6)/3, (9+0+3)/3) = (5, 4).
    # Doubled areas |(0-5)(y-0) - (0-x)(4-0)| = |-5y + 4x|: x=1,y=4: 16; x=2,y=1: 3; x=3,y=2: 2.
    # -> index 1. Bucket 2: a = (1, 4), next = (7, 1). |(1-7)(y-4) - (1-x)(1-4)| =
    # |-6y + 24 + 3 - 3x|: x=4,y=9: 39; x=5,y=0: 12; x=6,y=3: 9 -> index 4.
    assert lttb(xs, ys, 4) == [0, 1, 4, 7]


def test_lttb_keeps_first_last_and_exactly_threshold_points():
    xs = list(range(100_000))
    ys = [math.sin(x / 500) + (x % 7) / 10 for x in xs]
    for threshold in (2, 3, 1000, 2000, 99_999):
        kept = lttb(xs, ys, threshold)
        assert len(kept) == threshold
        assert kept[0] == 0 and kept[-1] == 99_999
        assert kept == sorted(set(kept))


def test_lttb_keeps_a_lone_spike():
    ys = [0.0] * 10_000
    ys[4321] = 100.0
    kept = lttb(list(range(10_000)), ys, 50)
    assert 4321 in kept


def reference_aggregate(points: list[tuple]) -> tuple[dict, dict]:
    """The rollups by their definitions, point by point: per series, axis and level, each bucket
    summarises its points taken in x order of their finest buckets, stored order within one:
    the first of the lowest x, the last of the highest, the first of the lowest y, the first of
    the highest y."""
    stats: dict = {}
    for kind, name, step, ts, _ in points:
        st = stats.setdefault((kind, name), [0, step, step, ts, ts])
        st[:] = [st[0] + 1, min(st[1], step), max(st[2], step), min(st[3], ts), max(st[4], ts)]

    def bucket(x, level):  # a coarser bucket holds whole finest ones, clamped or not
        finest = LEVELS[0]
        if isinstance(x, int):
            return x >> level
        clamped = max(-BUCKET_LIMIT, min(BUCKET_LIMIT, math.floor(x / 2**finest)))
        return clamped >> (level - finest)

    rollups: dict = {}
    for axis, at in (("step", 2), ("time", 3)):
        series: dict = {}
        for point in points:
            series.setdefault(point[:2], []).append((point[at], point[4]))
        for (kind, name), xy in series.items():
            finest = sorted(range(len(xy)), key=lambda i: bucket(xy[i][0], LEVELS[0]))
            for level in LEVELS:
                groups: dict = {}
                for i in finest:
                    groups.setdefault(bucket(xy[i][0], level), []).append(xy[i])
                for b, group in groups.items():
                    first = min(group, key=lambda p: p[0])
                    last = max(reversed(group), key=lambda p: p[0])
                    low = min(group, key=lambda p: p[1])
                    high = max(group, key=lambda p: p[1])
                    acc = [len(group), *first, *last, *low, *high]
                    rollups[(kind, name, axis, level, b)] = acc
    return stats, rollups


def test_the_rollups_follow_their_definitions_under_ties_and_disorder():
    import random

    rng = random.Random(7)
    points = []
    for _ in range(3000):
        step = rng.choice([rng.randrange(0, 200), rng.randrange(0, 100_000)])
        ts = T0 + rng.choice([step, rng.randrange(-50, 5000) * 0.5])  # equal x, and out of order
        value = rng.choice([0.5, 1.0, -2.0, rng.random()])  # many equal values
        points.append((rng.choice(["train", "system"]), rng.choice(["a", "b"]), step, ts, value))
    points.append(("train", "far", 3, 1e300, 1.0))  # a time bucket clamped to fit a bigint
    assert aggregate(points) == reference_aggregate(points)
