"""A job's environment is an allow-list (issue 12, point 1; docs/ARCHITECTURE.md, invariant 8).

A real job through the real local executor prints its environment and reads every
/proc/*/environ it can: nothing of the server's environment (planted here in the test
process, which plays the worker), no job token, no record key, no runner setting reaches it.
"""

import json
import os

import pytest
from sf.contract import tracking_token

from jobs.job_tokens import job_token
from jobs.models import Job
from tests.local_jobs import finished, python_job, run_until, start, texts

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("local_jobs")]

PLANTED = {
    "DATABASE_URL": "postgres://secret@ledger.internal/starforge",
    "SF_SECRET_KEY": "planted-secret-key-0123456789-0123456789-0123456789",
    "AWS_SECRET_ACCESS_KEY": "planted-aws-secret",
}
LOOK_AROUND = """
import json, os
found = []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        continue
    for needle in NEEDLES:
        if needle.encode() in raw:
            found.append([int(pid), needle])
print(json.dumps({"env": dict(os.environ), "found": found, "uid": os.getuid()}), flush=True)
"""
# What a job may see, beyond its own variables: the base, the contract, its GPUs.
ALLOWED = {
    "PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME", "PYTHONPATH",
    "PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES", "SF_RUN_ID", "SF_ATTEMPT", "SF_JOB_ID",
    "SF_OUTPUT_DIR", "SF_CHECKPOINT_DIR", "SF_METRICS_FILE", "SF_NOTICE_FILE",
    "SF_PREEMPT_GRACE_S",
    # MLflow's client: the endpoint and the job's one-way tracking credential (never the token).
    "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN",
}  # fmt: skip
RUNNER_ONLY = {
    "SF_JOB_TOKEN", "SF_BOOTSTRAP_TOKEN", "SF_RECORD_KEY", "SF_EXIT_FILE", "SF_STARTED_FILE",
    "SF_PROC_FILE", "SF_API_URL", "SF_USER_ENV", "SF_RUN_AS_UID", "SF_RUN_AS_GID",
    "SF_RUN_AS_USER", "SF_STOP_GRACE_S",
}  # fmt: skip


@pytest.fixture(autouse=True)
def _planted_in_the_worker(monkeypatch):
    for key, value in PLANTED.items():
        monkeypatch.setenv(key, value)


def run_looking_around(team, alice, needles: list[str]) -> dict:
    code = f"NEEDLES = {needles!r}\n" + LOOK_AROUND
    job = python_job(team, alice, code, total_gpus=1)
    Job.objects.filter(pk=job.pk).update(env={"MY_SETTING": "mine"})
    start(job)
    run_until(lambda: finished(job))
    job.refresh_from_db()
    assert job.status == "SUCCEEDED", job.status_reason
    return {**json.loads(texts(job)[0]), "job": job}


@pytest.mark.parametrize("run_as", [None, ""], ids=["default", "server-user"])
def test_a_job_sees_only_its_own_variables_the_contract_and_the_base(
    team, alice, local_cluster, run_as
):
    if run_as is not None:
        local_cluster.settings = {**local_cluster.settings, "run_as": run_as}
        local_cluster.save()
    seen = run_looking_around(team, alice, [])
    env = seen["env"]
    assert env.pop("MY_SETTING") == "mine"
    assert set(env) <= ALLOWED, set(env) - ALLOWED
    assert not set(env) & RUNNER_ONLY
    assert env["CUDA_VISIBLE_DEVICES"] in {"0", "1", "2", "3"}
    for value in PLANTED.values():
        assert value not in json.dumps(env)
    assert os.environ["PATH"] != env["PATH"]  # the base PATH, not the worker's
    # MLflow's credential is the one-way tracking token: the job token is nowhere in it.
    job = seen["job"]
    token = job_token(job.pk, job.current_attempt.number)
    assert env["MLFLOW_TRACKING_TOKEN"] == tracking_token(token)
    assert token.split(":")[-1] not in json.dumps(env)


def test_a_job_reads_no_environ_of_the_server_or_its_runner(team, alice):
    # Run as root, the default runs the job under its team's uid: every other process's
    # environ is out of its reach, the test process's (the worker's) and its runner's alike.
    assert os.geteuid() == 0, "needs root: the server-user case trusts the job by design"
    needles = [*PLANTED.values(), "SF_JOB_TOKEN=", "SF_RECORD_KEY=", "SF_BOOTSTRAP_TOKEN="]
    seen = run_looking_around(team, alice, [*needles, "MY_SETTING=mine"])
    assert seen["uid"] != 0
    # It did read environs: its own, which holds its own variable and nothing else found.
    assert {needle for _pid, needle in seen["found"]} == {"MY_SETTING=mine"}
