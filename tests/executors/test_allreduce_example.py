"""examples/allreduce for real, as its README runs it: `sf submit --dir examples/allreduce` with
no other argument submits the [job] table of its starforge.toml (two nodes), the local executor
runs both ranks, and they all-reduce over TCP through rank 0; `sf job status` and
`sf job logs --rank` read the result back."""

import json
from pathlib import Path

import pytest

from jobs import kick
from jobs.actions.tokens import issue_token
from jobs.models import Job
from jobs.states import JobStatus
from jobs.stores import logstore
from tests.client.helpers import run_cli
from tests.local_jobs import finished, run_until, start

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("local_jobs")]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "allreduce"


def lines(job: Job) -> list[dict]:
    return [json.loads(raw) for raw in logstore.read(job.pk, None, 10_000).raw_lines]


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


def test_submit_dir_allreduce_runs_two_ranks_that_sum_over_tcp(sf):
    code, out = sf("submit", "--dir", str(EXAMPLE))
    assert code == 0, out
    job = Job.objects.get()
    assert (job.nodes, job.total_gpus, job.entrypoint) == (2, 0, ["python", "train.py"])
    start(job)
    run_until(lambda: finished(job), timeout=60)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.status_reason

    got = lines(job)
    said = {(line["rank"], line["text"]) for line in got}
    assert (0, "rank 0 got 2 from rank 1") in said
    for rank in (0, 1):
        assert (rank, f"rank {rank} of 2: all-reduce sum 3 (expected 3)") in said
        [contract] = [t for r, t in said if r == rank and t.startswith("contract ")]
        assert f"NODE_RANK={rank}" in contract and "WORLD_SIZE=2" in contract
        assert "MASTER_ADDR=127.0.0.1" in contract and "MASTER_PORT=" in contract

    code, status = sf("job", "status", str(job.pk))
    assert code == 0 and "gpus:           0 (2 nodes × 0, virtual slots)" in status
    assert status.count(" succeeded  0") == 2  # both ranks, on this host

    code, one = sf("job", "logs", str(job.pk), "--rank", "1", "-n", "0", "--no-follow")
    rank_1 = [line["text"] for line in got if line["rank"] == 1]
    assert code == 0 and one.splitlines() == rank_1
    code, every = sf("job", "logs", str(job.pk), "-n", "0", "--no-follow")
    assert every.splitlines() == [f"[rank {ln['rank']}] {ln['text']}" for ln in got]
