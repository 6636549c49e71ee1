"""A local job in its own Python (the job environment of `make jobenv`: no `sf` installed), run
as its team's uid in its sandbox, logs with `sf.log` and with PyTorch's `SummaryWriter`, and
both reach the job's metrics (issue 49, points 2 and 3): the runner's copy of the SDK is
readable there, and the root runner reads the event files the job's uid wrote."""

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
import os, sf
from torch.utils.tensorboard import SummaryWriter
writer = SummaryWriter(os.path.join(os.environ["SF_OUTPUT_DIR"], "tb"))
for step in range(3):
    sf.log({"sdk_loss": 1.0 / (step + 1)}, step=step)
    writer.add_scalar("tb_loss", 2.0 / (step + 1), step)
    writer.add_scalar("eval/accuracy", step / 10, step)
writer.close()
print("uid", os.getuid(), "sf", sf.__file__)
"""


def test_sdk_and_tensorboard_scalars_of_a_job_in_its_own_python_reach_its_metrics(
    team, alice, job_python
):
    job = queued_job(team, alice, total_gpus=0, entrypoint=[str(job_python), "-c", TRAIN])
    start(job)
    run_until(lambda: finished(job), timeout=90)
    job.refresh_from_db()
    assert job.status == "SUCCEEDED", (job.status_reason, texts(job))
    said = texts(job)[-1].split()
    assert said[1] != "0" and said[3].endswith("/sdk/sf/__init__.py")
    series = series_rows(job.pk)
    assert series[("train", "sdk_loss")][:3] == [3, 0, 2]  # count, first and last step
    assert series[("train", "tb_loss")][:3] == [3, 0, 2]
    assert series[("validation", "eval/accuracy")][:3] == [3, 0, 2]
