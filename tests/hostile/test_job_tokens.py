"""Job tokens name one attempt and die with it; engines whose specs others read get a one-time
bootstrap credential instead, and nothing the runner signs with reaches their specs."""

import datetime as dt
import json

import pytest
from django.core import signing
from django.test import Client
from django.utils import timezone

from jobs.api.ingest import INGEST_GRACE_S
from jobs.job_tokens import BOOTSTRAP_SALT, JOB_TOKEN_SALT, bootstrap_token_for, job_token
from jobs.ledger import clocks
from jobs.loops import launcher
from jobs.models import Attempt, Cluster, Job
from tests.api_helpers import assert_refused, submit
from tests.ingesting import attach_attempt

pytestmark = pytest.mark.django_db
OLD_COMMITTED_KEY = "dev-only-insecure-key-change-me-in-production"


def runner(token: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def post(client: Client, path: str, body: dict):
    return client.post(f"/api/v1/ingest/{path}", json.dumps(body), content_type="application/json")


@pytest.fixture
def attempt(api) -> Attempt:
    return attach_attempt(submit(api), 1)


def lines(attempt: int) -> dict:
    return {"attempt": attempt, "lines": [{"seq": 0, "stream": "stdout", "ts": 1.0, "text": "x"}]}


def test_a_token_signed_with_the_old_committed_key_is_refused(attempt):
    for payload in (f"{attempt.job_id}.1", f"{attempt.job_id}.1.{attempt.token_nonce}"):
        forged = signing.Signer(key=OLD_COMMITTED_KEY, salt=JOB_TOKEN_SALT).sign(payload)
        assert_refused(post(runner(forged), "logs", lines(1)), 401)


def test_a_token_expires_with_its_attempt_and_the_grace(attempt):
    token = job_token(attempt.job_id, 1)
    clocks.close_open([attempt.pk], timezone.now(), "stopped")
    assert post(runner(token), "logs", lines(1)).status_code == 200  # the runner's last flush
    past = timezone.now() - dt.timedelta(seconds=INGEST_GRACE_S + 1)
    Attempt.objects.filter(pk=attempt.pk).update(end_time=past)
    assert_refused(post(runner(token), "logs", lines(1)), 410, "over")


def test_a_token_is_refused_for_any_other_attempt(attempt):
    token = job_token(attempt.job_id, 1)
    attach_attempt(attempt.job_id, 2)
    assert_refused(post(runner(token), "logs", lines(2)), 410, "attempt 1")
    assert_refused(post(runner(token), "logs", lines(1)), 410, "attempt 1")


def test_the_bootstrap_credential_is_exchanged_once_for_the_job_token(attempt):
    bootstrap = runner(bootstrap_token_for(attempt))
    answer = post(bootstrap, "token", {"attempt": 1})
    assert answer.status_code == 200, answer.content
    token = answer.json()["token"]
    assert post(runner(token), "logs", lines(1)).status_code == 200
    assert_refused(post(bootstrap, "token", {"attempt": 1}), 409, "once")


def test_a_bootstrap_credential_is_not_a_job_token_nor_the_other_way_round(attempt):
    assert_refused(post(runner(bootstrap_token_for(attempt)), "logs", lines(1)), 401)
    assert_refused(post(runner(job_token(attempt.job_id, 1)), "token", {"attempt": 1}), 401)
    forged = signing.Signer(salt=BOOTSTRAP_SALT).sign(f"{attempt.job_id}.1.{'0' * 32}")
    assert_refused(post(runner(forged), "token", {"attempt": 1}), 401)


@pytest.mark.parametrize("kind", ["ray", "kubernetes"])
def test_engines_whose_specs_others_read_get_only_the_bootstrap_credential(attempt, kind):
    job = Job.objects.select_related("cluster", "team").get(pk=attempt.job_id)
    job.cluster = Cluster(name=kind, kind=kind, settings={})
    env = launcher.launch_spec(job, attempt).env
    assert "SF_BOOTSTRAP_TOKEN" in env
    assert "SF_JOB_TOKEN" not in env and "SF_RECORD_KEY" not in env


def test_the_local_executor_gets_the_job_token_the_record_key_and_the_user_env_apart(attempt):
    Job.objects.filter(pk=attempt.job_id).update(env={"WANDB_MODE": "offline"})
    job = Job.objects.select_related("cluster", "team").get(pk=attempt.job_id)
    env = launcher.launch_spec(job, attempt).env
    assert env["SF_JOB_TOKEN"] == job_token(job.pk, 1)
    assert env["SF_RECORD_KEY"] and env["SF_RECORD_KEY"] not in env["SF_JOB_TOKEN"]
    assert json.loads(env["SF_USER_ENV"]) == {"WANDB_MODE": "offline"}
