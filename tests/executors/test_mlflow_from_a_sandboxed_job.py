"""MLflow's real client, unchanged, in a local job's own Python, run as its team's uid in its
sandbox, logs into the job through the runner's forwarder (issue 49, point 1): its metrics
reach the job's series, a val_-prefixed one as validation."""

import os

import pytest

from tests.factories import queued_job
from tests.local_jobs import finished, run_until, start, texts
from tests.stores.metric_rows import series_rows

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("local_jobs"),
    pytest.mark.skipif(os.geteuid() != 0, reason="run_as and the sandbox need root"),
]

TRAIN = """
import mlflow
with mlflow.start_run():
    mlflow.log_param("lr", 0.1)
    for step in range(3):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
        mlflow.log_metric("val_loss", 2.0 / (step + 1), step=step)
print("logged")
"""


def test_mlflow_client_in_a_sandboxed_job_logs_into_the_job(team, alice, job_python):
    job = queued_job(team, alice, total_gpus=0, entrypoint=[str(job_python), "-c", TRAIN])
    start(job)
    run_until(lambda: finished(job), timeout=120)
    job.refresh_from_db()
    assert job.status == "SUCCEEDED", (job.status_reason, texts(job)[-20:])
    series = series_rows(job.pk)
    assert series[("train", "loss")][:3] == [3, 0, 2]
    assert series[("validation", "val_loss")][:3] == [3, 0, 2]
