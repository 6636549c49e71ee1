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
from tests.factories import queued_job, with_attempt

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


def test_sweeps_whose_batches_share_many_keys_do_not_deadlock(team, make_user, monkeypatch):
    # Batches of 40 attempts over 6 days and 4 users: every batch touches many of the same
    # records, in orders that differ between batches unless the upsert sorts its keys.
    monkeypatch.setattr("metering.records.SWEEP_BATCH", 40)
    users = [make_user(f"u{i}", team) for i in range(4)]
    for rep in range(100):
        for day in range(6):
            start = START + dt.timedelta(days=(day * 7 + rep) % 6, minutes=rep)
            with_attempt(
                queued_job(team, users[(rep + day) % 4]),
                "SUCCEEDED",
                start_time=start,
                end_time=start + dt.timedelta(minutes=5),
            )
    errors, added = [], []
    barrier = threading.Barrier(4)

    def sweep():
        try:
            barrier.wait()
            added.append(meter_ended())
        except Exception as exc:  # a deadlock surfaces here as OperationalError
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sum(added) == 600
    assert check_usage_records().violations == []
