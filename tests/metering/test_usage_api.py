"""`GET /api/v1/usage`: grouped totals of the caller's teams only, defaults, and validation."""

import datetime as dt

import pytest
from django.db import connection
from django.utils import timezone

from metering.records import _unrecorded_of, meter_ended
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)


@pytest.fixture(autouse=True)
def _frozen(monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: NOW)


def ran(team, user, start, hours, total_gpus=1, cluster=None, running=False):
    job = queued_job(team, user, total_gpus=total_gpus, cluster=cluster or team.default_cluster)
    end = None if running else start + dt.timedelta(hours=hours)
    return with_attempt(job, "RUNNING" if running else "SUCCEEDED", start_time=start, end_time=end)


@pytest.fixture
def usage(team, alice, make_team, make_user, noop_cluster):
    """vision: alice 2 GPU-h on Nov 10 (local) + bob 3 GPU-h on Nov 11 (bench, running now);
    nlp: carol 5 GPU-h on Nov 12; and 7 GPU-h of alice in October."""
    bob = make_user("bob", team)
    nlp = make_team("nlp")
    carol = make_user("carol", nlp)
    ran(team, alice, dt.datetime(2026, 11, 10, 8, tzinfo=dt.UTC), hours=1, total_gpus=2)
    ran(team, alice, dt.datetime(2026, 10, 30, 8, tzinfo=dt.UTC), hours=7)
    ran(nlp, carol, dt.datetime(2026, 11, 12, 8, tzinfo=dt.UTC), hours=5)
    meter_ended()
    ran(team, bob, NOW - dt.timedelta(hours=3), 0, cluster=noop_cluster, running=True)
    return {"bob": bob, "nlp": nlp, "carol": carol}


def test_defaults_to_this_month_by_team_of_my_teams_with_running_attempts_live(usage, api):
    answer = api.get("/usage").json()
    assert answer == {
        "since": "2026-11-01",
        "until": "2026-11-21",
        "by": "team",
        "rows": [
            {
                "team": "vision",
                "gpu_seconds": 5 * 3600.0,
                "gpu_hours": 5.0,
                "borrowed_gpu_hours": 0.0,
                "cost": "0.00",  # no GPU prices set
                "active_gpu_hours": 0.0,  # no runner reported activity
                "idle_gpu_hours": 0.0,
                "efficiency": 0.0,
            }
        ],
        "total_gpu_seconds": 5 * 3600.0,
        "total_gpu_hours": 5.0,
        "total_cost": "0.00",
        "currency": "USD",
    }


@pytest.mark.parametrize(
    ("by", "rows"),
    [
        ("user", [("alice", 2.0), ("bob", 3.0)]),
        ("cluster", [("bench", 3.0), ("local", 2.0)]),
        ("day", [("2026-11-10", 2.0), ("2026-11-20", 3.0)]),
    ],
)
def test_grouped_by_user_cluster_or_day(usage, api, by, rows):
    answer = api.get("/usage", by=by).json()
    assert answer["by"] == by
    assert [(row[by], row["gpu_hours"]) for row in answer["rows"]] == rows
    assert all(
        set(row)
        == {by, "gpu_seconds", "gpu_hours", "borrowed_gpu_hours", "cost"}
        | {"active_gpu_hours", "idle_gpu_hours", "efficiency"}
        for row in answer["rows"]
    )


def test_since_and_until_choose_the_days(usage, api):
    answer = api.get("/usage", since="2026-10-01", until="2026-11-01", by="day").json()
    assert answer["rows"] == [
        {
            "day": "2026-10-30",
            "gpu_seconds": 7 * 3600.0,
            "gpu_hours": 7.0,
            "borrowed_gpu_hours": 0.0,
            "cost": "0.00",
            "active_gpu_hours": 0.0,
            "idle_gpu_hours": 0.0,
            "efficiency": 0.0,
        }
    ]


def test_a_team_i_am_not_in_is_not_found(usage, api):
    answer = api.get("/usage", team="nlp")
    assert answer.status_code == 404
    assert answer.json()["detail"] == "team nlp does not exist or you are not in it"
    assert api.get("/usage", team="nope").json()["detail"] == (
        "team nope does not exist or you are not in it"
    )


def test_a_viewer_reads_their_teams_usage(usage, make_user, api_as):
    viewer = make_user("val", usage["nlp"], role="viewer")
    answer = api_as(viewer).get("/usage", team="nlp").json()
    assert answer["rows"] == [
        {
            "team": "nlp",
            "gpu_seconds": 5 * 3600.0,
            "gpu_hours": 5.0,
            "borrowed_gpu_hours": 0.0,
            "cost": "0.00",
            "active_gpu_hours": 0.0,
            "idle_gpu_hours": 0.0,
            "efficiency": 0.0,
        }
    ]


def test_staff_see_every_team_and_a_user_in_no_team_sees_nothing(usage, make_user, api_as):
    staff = make_user("root")
    staff.is_staff = True
    staff.save()
    rows = api_as(staff).get("/usage").json()["rows"]
    assert [(row["team"], row["gpu_hours"]) for row in rows] == [("nlp", 5.0), ("vision", 5.0)]
    lonely = api_as(make_user("lonely")).get("/usage").json()
    assert (lonely["rows"], lonely["total_gpu_hours"]) == ([], 0.0)


@pytest.mark.parametrize(
    ("params", "status", "detail"),
    [
        ({"since": "2026-11-31"}, 400, "since must be a UTC day as YYYY-MM-DD, got '2026-11-31'"),
        ({"until": "20261101"}, 400, "until must be a UTC day as YYYY-MM-DD, got '20261101'"),
        ({"since": "2026-11-10", "until": "2026-11-01"}, 400, "since 2026-11-10 is after until"),
        ({"since": "2025-01-01", "until": "2026-01-03"}, 400, "is 367 days; ask for at most 366"),
        (
            {"by": "week"},
            422,
            "by: Input should be 'team', 'user', 'cluster', 'gpu_type' or 'day'",
        ),
        ({"team": "a\x00b"}, 422, "team: must not contain NUL characters"),
    ],
)
def test_bad_queries_get_a_sentence(usage, api, params, status, detail):
    answer = api.get("/usage", **params)
    assert answer.status_code == status
    assert detail in answer.json()["detail"]


def test_without_a_token_it_is_refused(usage):
    from django.test import Client

    assert Client().get("/api/v1/usage").status_code == 401


@pytest.mark.parametrize("narrowed", [False, True])
def test_the_unrecorded_part_is_read_by_an_index_that_leaves_out_never_started_attempts(
    usage, team, narrowed
):
    """Pending attempts pile up in a busy ledger; a usage answer must not read each of them."""
    midnight = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    ids = {"team0": team.pk} if narrowed else {}
    rows = _unrecorded_of((1 if narrowed else None, None), midnight, **ids)
    sql, params = rows.query.sql_with_params()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":  # the tables are tiny: make any index preferable
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute(f"EXPLAIN {sql}", params)
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        plan = " ".join(str(row) for row in cursor.fetchall())
    assert "attempt_started_unmetered" in plan, plan
