"""Fixtures shared by the server suites: isolated storage dirs, teams, users, tokens, clusters."""

import os
import uuid
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from jobs import kick
from jobs.actions.tokens import issue_token
from jobs.executors import override
from jobs.models import Cluster, ClusterGrant, Membership, Team
from jobs.redis_client import client
from jobs.stores import objects, queueplan
from jobs.traversable import interpreter_paths, open_the_way
from metering.prices import forget_prices
from tests.access import let_jobs_reach_the_interpreter, let_jobs_through
from tests.s3 import s3_url, serve_s3
from tests.scripted import ScriptedExecutor

# Opt-in fixtures of their own modules (a test asks for them by name).
pytest_plugins = ["tests.local_jobs"]


@pytest.fixture(autouse=True, scope="session")
def _jobs_may_pass_through(tmp_path_factory):
    """Local jobs run under their team's uid when the suite runs as root (tests/access.py)."""
    let_jobs_reach_the_interpreter()
    let_jobs_through(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def job_python() -> Path:
    """A job's own training Python (`make jobenv`: PyTorch's CPU build, MLflow's client,
    TensorBoard), apart from the server's, reachable by a job's uid. A test that needs it and
    finds none fails with the command that makes it, never skips: a real-framework test that
    did not run has proved nothing."""
    named = os.environ.get("SF_TEST_JOB_PYTHON")
    python = Path(named) if named else Path(__file__).resolve().parents[1] / ".venv-jobs/bin/python"
    if not python.exists():
        pytest.fail(f"no job environment at {python}: run `make jobenv` (make test does)")
    venv = python.parent.parent
    masked = ("/tmp/", "/var/tmp/", "/run/", "/dev/shm/")
    if str(venv.resolve()).startswith(masked) and not any(
        str(venv.resolve()).startswith(os.path.realpath(p)) for p in settings.SF_SANDBOX_SOFTWARE
    ):
        pytest.fail(
            f"{venv} lies under a folder the job sandbox masks: name it in SF_SANDBOX_SOFTWARE "
            "(make test does)"
        )
    if os.geteuid() == 0:
        open_the_way(interpreter_paths(str(python)))
    return python


@pytest.fixture(autouse=True)
def _no_prices_of_another_test():
    """Pages read GPU prices through a short per-process cache (metering.prices): a test's
    rollback deletes its prices without a signal, so none may be left for the next test."""
    forget_prices()
    yield
    forget_prices()


@pytest.fixture(autouse=True)
def _isolated_storage(settings, tmp_path):
    """Snapshots, logs, run outputs and executor state go under this test's tmp dir."""
    let_jobs_through(tmp_path)
    settings.SF_SNAPSHOT_DIR = tmp_path / "snapshots"
    settings.SF_LOG_DIR = tmp_path / "logs"
    settings.SF_OUTPUT_ROOT = tmp_path / "runs"
    settings.SF_LOCAL_STATE_DIR = tmp_path / "local-executor"


@pytest.fixture(autouse=True)
def _no_queue_plan_of_another_test(settings):
    """The queue plan (jobs.stores.queueplan) is keyed by job id in a Redis the suite shares:
    one left by an earlier test's tick, or by an end-to-end stack's scheduler on its own
    database, would place this test's jobs of the same ids. Each test starts without one."""
    try:
        client(settings.REDIS_URL).delete(queueplan.KEY)
    except redis.RedisError:
        pass  # a test that points REDIS_URL at nothing


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    """Test users' passwords hashed cheaply: the default hasher costs about a second each."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def local_cluster(db) -> Cluster:
    return Cluster.objects.create(name="local", kind="local", settings={"gpu_slots": 4})


@pytest.fixture
def noop_cluster(db) -> Cluster:
    return Cluster.objects.create(name="bench", kind="noop", settings={"gpus": 1000})


@pytest.fixture
def make_team(db, local_cluster):
    def make(name: str = "vision", gpu_quota: int = 8, cluster: Cluster | None = None) -> Team:
        return Team.objects.create(
            name=name, gpu_quota=gpu_quota, default_cluster=cluster or local_cluster
        )

    return make


@pytest.fixture
def grant(team):
    """`grant(cluster)`: team vision (`to=`: another team) may use the cluster, as if staff
    granted it (`jobs.grants`); a team's default cluster is granted when the team is saved."""

    def give(cluster: Cluster, to: Team | None = None) -> Cluster:
        ClusterGrant.objects.get_or_create(team=to or team, cluster=cluster)
        return cluster

    return give


@pytest.fixture
def make_user(db):
    def make(username: str, team: Team | None = None, role: str = "member") -> User:
        user = User.objects.create_user(username=username, password="pw")
        if team is not None:
            Membership.objects.create(team=team, user=user, role=role)
        return user

    return make


class ApiClient:
    """Django's test client against the real URL map, with a user's bearer token."""

    def __init__(self, user: User) -> None:
        self.user = user
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {issue_token(user)}")

    def get(self, path: str, **params):
        return self.client.get(f"/api/v1{path}", params)

    def post(self, path: str, json=None, **extra):
        return self.client.post(
            f"/api/v1{path}", json or {}, content_type="application/json", **extra
        )


@pytest.fixture
def api_as():
    return ApiClient


@pytest.fixture
def team(make_team):
    return make_team("vision", gpu_quota=8)


@pytest.fixture
def alice(make_user, team):
    return make_user("alice", team)


@pytest.fixture
def api(alice) -> ApiClient:
    return ApiClient(alice)


@pytest.fixture(autouse=True)
def _fresh_throttle_counts(settings, request):
    """Each test counts failed sign-ins and bad tokens from zero, in its own in-memory cache."""
    settings.CACHES = {
        **settings.CACHES,
        "throttle": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": f"throttle-{request.node.nodeid}",
        },
    }


@pytest.fixture
def kicks(monkeypatch) -> list[str]:
    """Record the scheduler kicks a test causes, instead of sending a Celery task to a broker:
    ["tick"] per kick (`jobs.kick.scheduler`)."""
    sent: list[str] = []
    monkeypatch.setattr(kick, "scheduler", lambda: sent.append("tick"))
    return sent


@pytest.fixture
def use_executor():
    """`use_executor(make)`: every executor lookup `executor_for(c)` answers `make(c)` for the
    rest of the test (`use_executor(make, cluster)`: only that cluster's); `make` is an executor
    class or a callable such as `ScriptedExecutor`. See `jobs.executors.override`."""
    with ExitStack() as stack:
        yield lambda make, cluster=None: stack.enter_context(override(cluster, make))


@pytest.fixture
def backend(use_executor) -> ScriptedExecutor:
    """Replace every executor with one scripted backend for the test."""
    fake = ScriptedExecutor()
    use_executor(fake)
    return fake


@pytest.fixture
def shared_ledger() -> None:
    """Skip on the in-memory SQLite ledger: threads share the embedded ledger only in a file
    (SF_SQLITE_TEST_DB, as `make test`'s SQLite run has it)."""
    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        pytest.skip("threads share the embedded ledger only in a file (SF_SQLITE_TEST_DB)")


@pytest.fixture
def in_memory_layer(settings):
    """Channels' in-memory layer for the websockets of this test (tests.sockets), no Redis."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """The endpoint of a real S3 server (`rclone serve s3`) for this session; bucket `starforge`."""
    yield from serve_s3(tmp_path_factory)


@pytest.fixture
def on_s3(settings, s3_server):
    """Snapshots and logs of this test in the S3 server, under a prefix of its own, so tests
    never see each other's objects."""
    settings.SF_STORAGE = objects.parse_storage_url(s3_url(s3_server, f"t-{uuid.uuid4().hex}"))
    return settings.SF_STORAGE


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def storage(request) -> str:
    """A test that asks for it runs on each store: its snapshots and logs in this test's
    directories ("local"), then in the S3 server (`on_s3`)."""
    if request.param == "s3":
        request.getfixturevalue("on_s3")
    return request.param
