"""Metrics that real training code already logs reach the job's Charts, with no `import sf`:
a local job in its own Python (`make jobenv`: PyTorch's CPU build, MLflow's client,
TensorBoard), run as its team's uid in its sandbox, trains a tiny model and logs its loss the
way it always has, through `mlflow.log_metric` or through PyTorch's `SummaryWriter` under
$SF_OUTPUT_DIR or under $TENSORBOARD_LOGDIR in the sandbox's private /tmp. The job's metrics
API (`GET /api/v1/jobs/{id}/metrics`, what the Charts tab draws) answers each series with the
steps the code logged.
"""

import os
import uuid
from pathlib import Path

import pytest

from tests.factories import queued_job
from tests.local_jobs import finished, run_until, start, texts

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("local_jobs")]
STEPS = 8

# A real (if tiny) training loop: its loss is whatever PyTorch computes.
TRAIN = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(64, 4)
y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


def train_step():
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
"""

MLFLOW = f"""{TRAIN}
import mlflow
mlflow.start_run()
mlflow.log_param("lr", 0.1)
for i in range({STEPS}):
    loss = train_step()
    mlflow.log_metric("loss", loss, step=i)
    print("step", i, "loss", loss)
mlflow.log_metric("val_loss", loss * 1.5, step={STEPS - 1})
mlflow.end_run()
"""

TENSORBOARD = f"""{TRAIN}
import os
from torch.utils.tensorboard import SummaryWriter
writer = SummaryWriter(os.path.join(os.environ["SF_OUTPUT_DIR"], "tb"))
for i in range({STEPS}):
    loss = train_step()
    writer.add_scalar("loss", loss, i)
    print("step", i, "loss", loss)
writer.add_scalar("val/loss", loss * 1.5, {STEPS - 1})
writer.close()
"""


# The same, into the folder the job's environment names: in its sandbox's private /tmp.
TENSORBOARD_LOGDIR = f"""{TRAIN}
import os
from torch.utils.tensorboard import SummaryWriter
writer = SummaryWriter(os.environ["TENSORBOARD_LOGDIR"])
for i in range({STEPS}):
    loss = train_step()
    writer.add_scalar("loss", loss, i)
    print("step", i, "loss", loss)
writer.close()
print("wrote", *sorted(os.listdir(os.environ["TENSORBOARD_LOGDIR"])))
"""


def run_to_success(team, alice, job_python, code: str, env: dict | None = None):
    job = queued_job(
        team, alice, total_gpus=0, entrypoint=[str(job_python), "-c", code], env=env or {}
    )
    start(job)
    run_until(lambda: finished(job), timeout=120)
    job.refresh_from_db()
    assert job.status == "SUCCEEDED", (job.status_reason, texts(job)[-20:])
    return job


def printed_losses(job) -> list[float]:
    return [float(text.split()[3]) for text in texts(job) if text.startswith("step ")]


def charted(api, job, kind: str) -> dict:
    answer = api.get(f"/jobs/{job.pk}/metrics", kind=kind)
    assert answer.status_code == 200, answer.content
    return answer.json()["series"]


def test_mlflow_log_metric_from_real_training_code_reaches_the_charts(team, alice, api, job_python):
    job = run_to_success(team, alice, job_python, MLFLOW)
    losses = printed_losses(job)
    train = charted(api, job, "train")
    assert train["loss"]["x"] == list(range(STEPS))
    assert train["loss"]["y"] == pytest.approx(losses)
    assert losses[-1] < losses[0]  # it trained
    validation = charted(api, job, "validation")
    assert validation["val_loss"]["x"] == [STEPS - 1]


def test_summary_writer_under_the_output_dir_reaches_the_charts(team, alice, api, job_python):
    job = run_to_success(team, alice, job_python, TENSORBOARD)
    losses = printed_losses(job)
    train = charted(api, job, "train")
    assert train["loss"]["x"] == list(range(STEPS))
    assert train["loss"]["y"] == pytest.approx(losses, rel=1e-6)  # float32 in the event file
    validation = charted(api, job, "validation")
    assert validation["val/loss"]["x"] == [STEPS - 1]


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox (a private /tmp) needs root")
def test_summary_writer_in_the_sandboxs_private_tmp_reaches_the_charts(
    team, alice, api, job_python
):
    """TENSORBOARD_LOGDIR=/tmp/...: the job's /tmp is its sandbox's own, which the host never
    sees; the runner reads the files there as the sandbox's anchor sees them."""
    logdir = f"/tmp/sf-tb-{uuid.uuid4().hex}"
    job = run_to_success(
        team, alice, job_python, TENSORBOARD_LOGDIR, env={"TENSORBOARD_LOGDIR": logdir}
    )
    assert any(t.startswith("wrote events.out.tfevents.") for t in texts(job))
    assert not Path(logdir).exists()  # written in the sandbox's /tmp, not the host's
    losses = printed_losses(job)
    train = charted(api, job, "train")
    assert train["loss"]["x"] == list(range(STEPS))
    assert train["loss"]["y"] == pytest.approx(losses, rel=1e-6)
