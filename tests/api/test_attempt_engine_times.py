"""`GET /api/v1/jobs/ID/attempts` carries the engine's own start and end beside the billed ones
(issue 50, point 0): what `sf job attempts` lists."""

import datetime as dt

import pytest

from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
T = dt.datetime(2026, 12, 7, 10, 0, tzinfo=dt.UTC)


def test_each_attempt_has_its_engine_times_beside_the_billed_ones(api, team, alice):
    job = queued_job(team, alice, total_gpus=2)
    with_attempt(
        job,
        "SUCCEEDED",
        job_ref="4711",
        native_state="COMPLETED",
        engine_start=T,
        engine_end=T + dt.timedelta(seconds=60),
        start_time=T,
        end_time=T + dt.timedelta(seconds=59.5),
    )
    [attempt] = api.get(f"/jobs/{job.pk}/attempts").json()
    assert (attempt["job_ref"], attempt["native_state"]) == ("4711", "COMPLETED")
    assert (attempt["engine_start"], attempt["engine_end"]) == (
        "2026-12-07T10:00:00Z",
        "2026-12-07T10:01:00Z",
    )
    assert attempt["end_time"] == "2026-12-07T10:00:59.500Z"
    assert attempt["gpu_seconds"] == 119.0  # metering's: billed time x GPUs
