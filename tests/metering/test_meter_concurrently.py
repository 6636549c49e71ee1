"""On real PostgreSQL: two sweeps at once still add every ended attempt exactly once."""

import datetime as dt
import threading

import pytest
from django.db import connection, connections
from django.db.models import Sum

from jobs.models import Attempt
from metering.consistency import check_usage_records
from metering.models import UsageRecord
from metering.records import meter_ended
from tests.jobs.factories import queued_job, with_attempt

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
START = dt.datetime(2026, 11, 10, 8, 0, tzinfo=dt.UTC)


@pytest.fixture(autouse=True)
def _needs_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("concurrency is proven on PostgreSQL (run by `make test`)")


def test_two_sweeps_at_once_meter_every_attempt_once(team, alice, monkeypatch):
    monkeypatch.setattr("metering.records.SWEEP_BATCH", 7)  # many small batches to interleave
    for n in range(120):
        start = START + dt.timedelta(minutes=n)
        with_attempt(
            queued_job(team, alice),
            "SUCCEEDED",
            start_time=start,
            end_time=start + dt.timedelta(minutes=30),
        )
    added, errors = [], []
    barrier = threading.Barrier(3)

    def sweep():
        try:
            barrier.wait()
            added.append(meter_ended())
        except Exception as exc:  # surfaced by the test below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sweep) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert sum(added) == 120
    assert not Attempt.objects.filter(metered=False).exists()
    total = UsageRecord.objects.aggregate(us=Sum("gpu_us"))["us"]
    assert total == 120 * 30 * 60 * 10**6
    assert check_usage_records(START + dt.timedelta(days=1)).violations == []
