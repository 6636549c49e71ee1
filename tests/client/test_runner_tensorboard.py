"""The runner ships a job's TensorBoard scalars (issue 49, point 2): a real job with its own
Python writes them with PyTorch's `SummaryWriter` under its output directory and under
TENSORBOARD_LOGDIR, and each tag reaches the metrics ingest as a series of its kind, with its
steps and wall times, the first while the job still runs."""

from __future__ import annotations

import time
from typing import Any

from tests.client.helpers import exit_record, pack, run_runner, runner_env

TRAIN = """
import os, time
from torch.utils.tensorboard import SummaryWriter
out = SummaryWriter(os.path.join(os.environ["SF_OUTPUT_DIR"], "runs", "a"))
logdir = SummaryWriter(os.environ["TENSORBOARD_LOGDIR"])
out.add_scalar("loss", 1.0, 0)
out.flush()
time.sleep(4)  # the runner's poll ships step 0 meanwhile
for step in (1, 2):
    out.add_scalar("loss", 1.0 / (step + 1), step)
    logdir.add_scalar("val/accuracy", 0.5 + step / 10, step)
out.close()
logdir.close()
"""


def test_summary_writer_scalars_reach_the_metrics_ingest_while_and_after_the_job_runs(
    fake_api: Any, tmp_path, job_python
):
    sha, data = pack(tmp_path, {"train.py": TRAIN})
    arrived: list[tuple[float, dict]] = []

    def metrics(request):
        arrived.extend((time.time(), p) for p in request.json()["points"])
        return 200, {"stored": len(request.json()["points"])}

    fake_api.route("GET /api/v1/ingest/snapshot", lambda r: (200, data))
    fake_api.route("POST /api/v1/ingest/metrics", metrics)
    env = runner_env(tmp_path, fake_api.url, sha, [str(job_python), "train.py"])
    env["TENSORBOARD_LOGDIR"] = "tb"  # relative: in the run dir
    result = run_runner(env)
    assert result.returncode == 0, result.stderr
    shipped = [
        ((p["kind"], p["name"], p["step"]), round(p["value"], 4))
        for _, p in arrived
        if p["kind"] != "system"
    ]
    assert len(shipped) == 5
    assert dict(shipped) == {
        ("train", "loss", 0): 1.0,
        ("train", "loss", 1): 0.5,
        ("train", "loss", 2): 0.3333,
        ("validation", "val/accuracy", 1): 0.6,
        ("validation", "val/accuracy", 2): 0.7,
    }
    seqs = [p["seq"] for _, p in arrived]
    assert len(seqs) == len(set(seqs))  # one numbering with the runner's other points
    first = next(at for at, p in arrived if p["name"] == "loss")
    assert first < exit_record(env)["ended_at"] - 1  # shipped while the job ran
