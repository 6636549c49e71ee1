"""A prepared read (`jobs.reads.prepared`) answers as its QuerySet does, for date and datetime
parameters as for ints and strs: the stand-ins it was built with are never what it runs with,
and a value Django would not store as such is refused, not run."""

import datetime as dt

import pytest
from django.utils import timezone

from jobs.models import Attempt, Job
from jobs.reads.job_rows import JOB_COLUMNS
from jobs.reads.prepared import Prepared
from metering.models import UsageRecord
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db

NOON = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)


def _ended_since(shape, since: dt.datetime, team: int):
    return Attempt.objects.filter(end_time__gte=since, job__team_id=team).values_list("pk")


def _days(shape, first: dt.date, last: dt.date):
    return (
        UsageRecord.objects.filter(day__gte=first, day__lte=last)
        .order_by("day")
        .values_list("day", "gpu_us")
    )


ENDED_SINCE = Prepared(_ended_since)
DAYS = Prepared(_days)


def test_a_datetime_parameter_reads_as_the_queryset_does(team, alice):
    ends = [NOON + dt.timedelta(hours=h) for h in (-30, -1, 0, 5)]
    for end in ends:
        with_attempt(queued_job(team, alice), "SUCCEEDED", start_time=end, end_time=end)
    # In another zone, the same instants: the parameter is an instant, not a wall clock.
    elsewhere = dt.timezone(dt.timedelta(hours=-8))
    for since in (NOON, NOON - dt.timedelta(days=2), NOON.astimezone(elsewhere), timezone.now()):
        expected = sorted(_ended_since((), since, team.pk))
        assert sorted(ENDED_SINCE.rows(since=since, team=team.pk)) == [list(r) for r in expected]
    assert len(ENDED_SINCE.rows(since=NOON - dt.timedelta(days=2), team=team.pk)) == 4
    assert len(ENDED_SINCE.rows(since=NOON, team=team.pk)) == 2


def test_a_date_parameter_reads_as_the_queryset_does_and_comes_back_a_date(
    team, alice, local_cluster
):
    first = dt.date(2026, 11, 1)
    for offset in range(10):
        UsageRecord.objects.create(
            day=first + dt.timedelta(days=offset),
            team=team,
            user=alice,
            cluster=local_cluster,
            gpu_us=offset,
        )
    rows = DAYS.rows(first=dt.date(2026, 11, 3), last=dt.date(2026, 11, 5))
    assert rows == [[dt.date(2026, 11, day), day - 1] for day in (3, 4, 5)]
    assert DAYS.rows(first=dt.date(2026, 12, 1), last=dt.date(2026, 12, 31)) == []


@pytest.mark.parametrize(
    "value",
    [dt.datetime(2026, 11, 20, 12, 0), 1.5, True, None],
    ids=["naive datetime", "float", "bool", "None"],
)
def test_a_read_built_with_a_value_of_another_kind_is_refused(value):
    unbuilt = Prepared(_ended_since)
    with pytest.raises(TypeError, match="a prepared read takes"):
        unbuilt.rows(since=value, team=1)


def _job_rows(shape, team: int):
    return Job.objects.filter(team_id=team).order_by("pk").values_list(*JOB_COLUMNS)


JOB_ROWS = Prepared(_job_rows)


def test_rows_are_converted_as_the_queryset_converts_them(team, alice, local_cluster):
    """Every JobOut column, through the converters the reads replace (datetimes, JSON and keys
    of it) and the ones they keep, against Django's own values for the same rows."""
    # 2**70 + 1: an int past 64 bits, which a float cannot hold (orjson reads one as a float).
    odd = ["x" * 3, {"nested": [1, 2.5, None, True]}, "\u00e9\u6f22", 2**70 + 1, -0.0]
    local_cluster.settings = {**local_cluster.settings, "preempt_grace_s": 45}
    local_cluster.save()
    plain = queued_job(team, alice)
    rich = queued_job(team, alice, entrypoint=["python", *map(str, odd)], then=odd)
    with_attempt(
        rich,
        "RUNNING",
        start_time=NOON,
        preempted_at=NOON + dt.timedelta(seconds=1, microseconds=5),
        ranks=[{"rank": 0, "node": "n1", "state": "RUNNING", "exit_code": None}],
    )
    expected = [list(row) for row in _job_rows((), team.pk)]
    rows = JOB_ROWS.rows(team=team.pk)
    assert rows == expected and len(rows) == 2
    assert [type(v) for v in rows[1]] == [type(v) for v in expected[1]]
    assert plain.pk == rows[0][0] and rows[1][-4].tzinfo is not None  # preempted_at, aware
    assert rows[1][-3] == 45 and rows[1][JOB_COLUMNS.index("then")] == odd
