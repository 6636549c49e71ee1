"""Metric ingest keeps the rollups exact: resends, batches out of order, batches at once."""

import threading
import time

import pytest
from django.db import connection, transaction

from jobs.models import MetricSeries
from jobs.stores.metrics.charts import series
from jobs.stores.metrics.chunks import stored_points
from jobs.stores.metrics.ingest import append
from tests.api_helpers import submit
from tests.ingesting import T0, attach_attempt, make_points, runner, send_points
from tests.stores.metric_rows import from_scratch, rollups, series_rows

pytestmark = pytest.mark.django_db


@pytest.fixture
def job_id(api) -> int:
    """A RUNNING job whose current attempt is 1."""
    job_id = submit(api)
    attach_attempt(job_id, 1)
    return job_id


def two_series(start: int, stop: int) -> list[dict]:
    """Points of "loss" and "lr" with distinct x and y: their rollups do not depend on order."""
    lr = [
        {**p, "seq": p["seq"] + 100_000, "value": 2 + p["value"]}
        for p in make_points(start, stop, name="lr")
    ]
    return make_points(start, stop) + lr


def assert_rolled_up_once(job_id: int, points_per_series: int) -> None:
    stats, expected = from_scratch(job_id)
    assert rollups(job_id) == expected
    assert series_rows(job_id) == stats
    for kind, name in stats:
        assert stats[(kind, name)][0] == points_per_series


def test_batches_out_of_order_and_resent_roll_up_each_point_once(job_id):
    client = runner(job_id)
    for start, stop, accepted in ((1000, 2000, 2000), (0, 1000, 2000), (500, 1500, 0)):
        response = send_points(client, two_series(start, stop))
        assert response.json()["accepted"] == accepted, (start, stop)
    assert_rolled_up_once(job_id, 2000)
    loss = series(job_id, "train", max_points=100)["loss"]
    assert (loss["total"], loss["x"][0], loss["x"][-1]) == (2000, 0, 1999)


def test_a_batch_in_reverse_with_a_repeated_seq_keeps_the_last_point_sent(job_id):
    points = make_points(0, 50)[::-1] + [{**make_points(7, 8)[0], "value": 42.0}]
    response = send_points(runner(job_id), points)
    assert response.json() == {"accepted": 50, "duplicates": 1, "dropped": 0}
    [seven] = [p for p in stored_points(job_id) if p[1] == 7]
    assert seven[5] == 42.0
    assert_rolled_up_once(job_id, 50)


def test_a_resend_past_the_cap_is_counted_as_duplicates_not_drops(job_id, settings):
    settings.SF_ATTEMPT_MAX_METRIC_POINTS = 30
    client = runner(job_id)
    assert send_points(client, make_points(0, 20)).json()["accepted"] == 20
    answer = send_points(client, make_points(0, 40)).json()
    assert answer == {"accepted": 10, "duplicates": 20, "dropped": 10}
    assert_rolled_up_once(job_id, 30)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_batches_stored_at_once_roll_up_each_point_once(job_id):
    if connection.vendor != "postgresql":
        pytest.skip("concurrency is proven on PostgreSQL (run by `make test`)")
    append(job_id, 1, two_series(0, 100))  # the series and some buckets exist
    later = [{**p, "step": p["step"] + 5000, "ts": p["ts"] + 5000} for p in two_series(0, 1500)]
    batches = [
        (1, two_series(0, 1500)),
        (1, two_series(500, 2000)),
        (1, two_series(0, 1500)),  # a resend racing its original
        (2, later),  # another attempt: its own counter, the same series and buckets
    ]
    accepted: list[int] = []

    def store(attempt: int, points: list[dict]) -> None:
        try:
            accepted.append(append(job_id, attempt, points).accepted)
        finally:
            connection.close()

    threads = [threading.Thread(target=store, args=batch) for batch in batches]
    with transaction.atomic():  # hold the series rows: every batch queues on its upsert
        list(MetricSeries.objects.select_for_update().filter(job_id=job_id))
        for thread in threads:
            thread.start()
        time.sleep(0.5)
    for thread in threads:
        thread.join()
    assert sum(accepted) == 2 * (2000 - 100) + 2 * 1500
    assert_rolled_up_once(job_id, 3500)
    assert series_rows(job_id)[("train", "loss")] == [3500, 0, 6499, T0, T0 + 6499]
