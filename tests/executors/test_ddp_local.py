"""examples/ddp for real on the local executor: `sf submit --nodes 2 --gpus 0 -- torchrun
train.py`, with no torchrun argument, in the job's own Python environment (`make jobenv`: the
CPU build of PyTorch; no `sf` package in it). Both ranks rendezvous through the PET_* variables
of the rank contract, train with DDP over gloo, and end with the same weights and a falling loss.
"""

import json
import os

import pytest

from jobs import kick
from jobs.actions.tokens import issue_token
from jobs.models import Job
from jobs.states import JobStatus
from jobs.stores import logstore
from tests import frameworks
from tests.access import JOB_UID, as_job
from tests.client.helpers import run_cli
from tests.local_jobs import finished, run_until, start
from tests.processes import job_processes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("local_jobs")]
STEPS = 30


def rank_lines(job: Job) -> list[frameworks.Line]:
    lines = (json.loads(raw) for raw in logstore.read(job.pk, None, 10_000).raw_lines)
    return [(line.get("rank"), line["text"]) for line in lines]


def test_a_jobs_uid_can_run_the_job_environments_python(job_python):
    # As root the local executor runs a team's job under an unprivileged uid: the job_python
    # fixture opened the way (o+x, jobs.traversable) to the venv and to the interpreter it
    # links to under root's home.
    # A job always has a HOME (jobs.executors.base.base_env); MLflow's import needs one.
    code = (
        "import os; os.environ['HOME'] = '/tmp'\n"
        "import mlflow, tensorboard, torch; print(os.getuid(), torch.__version__)"
    )
    done = as_job(str(job_python), "-c", code)
    assert done.returncode == 0, done.stderr
    uid, version = done.stdout.split()
    assert version.startswith("2.13.0") and (os.geteuid() != 0 or int(uid) == JOB_UID)


@pytest.fixture
def sf(live_server, alice, monkeypatch, tmp_path, capsys):
    """`sf ARGS` as alice against the live server: (exit code, stdout)."""
    monkeypatch.setattr(kick, "scheduler", lambda: None)  # the test admits the job itself
    monkeypatch.setenv("SF_CONFIG", str(tmp_path / "sf.json"))
    monkeypatch.setenv("SF_URL", live_server.url)
    monkeypatch.setenv("SF_TOKEN", issue_token(alice))

    def run(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = run_cli(list(argv))
        return code, capsys.readouterr().out

    return run


def test_torchrun_with_no_arguments_trains_two_ranks_to_the_same_weights(sf, job_python):
    code, out = sf(
        "submit", "--dir", str(frameworks.DDP_EXAMPLE), "--nodes", "2", "--gpus", "0",
        "--env", f"PATH={frameworks.job_path(job_python)}",
        "--", "torchrun", "train.py", "--steps", str(STEPS), "--sleep", "0",
    )  # fmt: skip
    assert code == 0, out
    job = Job.objects.get()
    assert (job.nodes, job.total_gpus, job.entrypoint[:2]) == (2, 0, ["torchrun", "train.py"])
    start(job)
    run_until(lambda: finished(job), timeout=frameworks.TRAINING_S)
    job.refresh_from_db()
    lines = rank_lines(job)
    assert job.status == JobStatus.SUCCEEDED, (job.status_reason, lines[-20:])

    assert [(r["rank"], r["state"], r["exit_code"]) for r in job.current_attempt.ranks] == [
        (0, "succeeded", 0),
        (1, "succeeded", 0),
    ]
    hashes = frameworks.weights(lines)
    assert sorted(hashes) == [0, 1] and hashes[0] == hashes[1], hashes
    for rank in (0, 1):
        points = frameworks.losses(lines, rank)
        assert [step for step, _ in points] == list(range(1, STEPS + 1)), rank
        assert frameworks.falls(points), points
    # Each rank trained on its own shard: the same step's losses differ between ranks.
    assert frameworks.losses(lines, 0) != frameworks.losses(lines, 1)
    assert not job_processes(job.run_id)
