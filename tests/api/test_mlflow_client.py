"""MLflow's official client (the job environment's mlflow 3.18, run in a subprocess) against a
live Starforge: a job's code logs into its attempt unchanged, and a member reads it back."""

import pytest

from jobs.actions.tokens import issue_token
from jobs.models import MetricChunk, TrackingValue
from jobs.stores.metrics.chunks import stored_points
from jobs.stores.metrics.ingest import TRACKING_SEQ_BASE
from tests.factories import queued_job, with_attempt
from tests.mlflow_calls import run_client, token_of

pytestmark = pytest.mark.django_db(transaction=True)

TRAINING = """
import json, mlflow
with mlflow.start_run() as run:
    mlflow.log_param("lr", 0.1)
    mlflow.log_params({"batch": 32, "optimizer": "adam"})
    mlflow.set_tag("stage", "pretrain")
    for step in range(5):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step, timestamp=1700000000000 + step)
    mlflow.log_metrics({"val_loss": 0.5, "accuracy": 0.9}, step=4)
    again = mlflow.get_run(run.info.run_id)
print(json.dumps({"run_id": run.info.run_id, "params": again.data.params,
                  "experiment_id": run.info.experiment_id}))
"""

READING = """
import json
from mlflow import MlflowClient
c = MlflowClient()
run = c.get_run("{run_id}")
history = c.get_metric_history("{run_id}", "loss")
found = c.search_runs(["{team_id}"])
exp = c.get_experiment_by_name("{team}")
print(json.dumps({{
    "status": run.info.status, "params": run.data.params, "metrics": run.data.metrics,
    "tags": {{k: v for k, v in run.data.tags.items() if k == "stage"}},
    "history": [(m.step, m.value, m.timestamp) for m in history],
    "found": [r.info.run_id for r in found],
    "experiment": [exp.experiment_id, exp.name],
    "experiments": [e.name for e in c.search_experiments()],
}}))
"""


def test_a_jobs_mlflow_code_logs_into_its_attempt_and_a_member_reads_it(
    live_server, job_python, team, alice
):
    job = queued_job(team, alice)
    with_attempt(job, "RUNNING")

    logged = run_client(job_python, live_server.url, token_of(job.pk), TRAINING)

    assert logged == {
        "run_id": f"{job.pk}-1",
        "params": {"lr": "0.1", "batch": "32", "optimizer": "adam"},
        "experiment_id": str(team.pk),
    }
    points = stored_points(job.pk)
    assert [(p[2], p[3], p[4], p[5]) for p in points] == [
        *[("train", "loss", s, 1.0 / (s + 1)) for s in range(5)],
        ("validation", "val_loss", 4, 0.5),
        ("train", "accuracy", 4, 0.9),
    ]
    assert points[0][6] == 1_700_000_000.0  # MLflow's ms kept as the store's epoch seconds
    assert all(p[1] >= TRACKING_SEQ_BASE for p in points)
    assert TrackingValue.objects.filter(job=job, kind="param").count() == 3

    script = READING.format(run_id=f"{job.pk}-1", team_id=team.pk, team=team.name)
    read = run_client(job_python, live_server.url, issue_token(alice), script)

    assert read["status"] == "RUNNING"  # the ledger's, not the FINISHED end_run reported
    assert read["params"] == {"lr": "0.1", "batch": "32", "optimizer": "adam"}
    assert read["metrics"] == {"loss": 0.2, "val_loss": 0.5, "accuracy": 0.9}
    assert read["tags"] == {"stage": "pretrain"}
    assert read["history"] == [[s, 1.0 / (s + 1), 1_700_000_000_000 + s] for s in range(5)]
    assert read["found"] == [f"{job.pk}-1"]
    assert read["experiment"] == [str(team.pk), team.name]
    assert read["experiments"] == [team.name]


LOGGING_A_BATCH = """
import json, time
from mlflow import MlflowClient
from mlflow.entities import Metric
c = MlflowClient()
run = c.create_run("0")
c.log_batch(run.info.run_id, metrics=[Metric("loss", float(i), 1700000000000, i)
                                      for i in range(2500)])
print(json.dumps({"run_id": run.info.run_id}))
"""


def test_log_batch_past_a_requests_limit_is_stored_once_in_order(
    live_server, job_python, team, alice
):
    job = queued_job(team, alice)
    with_attempt(job, "RUNNING")

    run_client(job_python, live_server.url, token_of(job.pk), LOGGING_A_BATCH)

    points = stored_points(job.pk)
    assert [p[4] for p in points] == list(range(2500))
    assert [p[1] for p in points] == list(range(TRACKING_SEQ_BASE, TRACKING_SEQ_BASE + 2500))
    assert MetricChunk.objects.filter(job=job).count() == 3  # the client's 1,000 per request


PAGED = """
import json
from mlflow import MlflowClient
history = MlflowClient().get_metric_history("{run_id}", "loss")
print(json.dumps([m.step for m in history]))
"""


def test_a_long_history_reads_whole_through_the_clients_pages(
    live_server, job_python, team, alice, settings
):
    job = queued_job(team, alice)
    with_attempt(job, "RUNNING")
    run_client(job_python, live_server.url, token_of(job.pk), LOGGING_A_BATCH)

    script = PAGED.format(run_id=f"{job.pk}-1")
    # The client asks for 25,000 a page; a smaller store page is tested in test_mlflow_routes.
    assert run_client(job_python, live_server.url, issue_token(alice), script) == list(range(2500))
