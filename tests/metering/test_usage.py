"""GPU-seconds of one attempt: only running time is billed."""

import datetime as dt

from metering.usage import attempt_gpu_seconds

T0 = dt.datetime(2026, 11, 10, 22, 0, tzinfo=dt.UTC)


def test_queued_and_pending_time_is_never_billed():
    assert attempt_gpu_seconds(None, T0, total_gpus=4) == 0.0
    assert attempt_gpu_seconds(T0, T0 + dt.timedelta(seconds=90), total_gpus=2) == 180.0


def test_a_running_attempt_accrues_up_to_now():
    assert attempt_gpu_seconds(T0, None, total_gpus=3, now=T0 + dt.timedelta(minutes=10)) == 1800.0
