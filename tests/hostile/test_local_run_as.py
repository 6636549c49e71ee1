"""Local jobs do not run as the server's unix user (issue 12, point 2).

As root (CI, single-box installs) the local executor runs each team's jobs under its own
unprivileged uid by default. A real job then reads nothing of SF_VAR_DIR (ledger, secret key,
snapshots, logs), lists neither the executor's state nor the run outputs, reads nothing of
another team's attempt, and cannot write its runner's records; it can write its own folders.
"""

import json
import os
import pwd
import time

import pytest

from jobs.executors.local import LocalExecutor
from jobs.models import Job
from tests.local_jobs import finished, python_job, run_until, start, texts

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("local_jobs"),
    pytest.mark.skipif(os.geteuid() != 0, reason="run_as needs the server to run as root"),
]

TRY_EVERYTHING = """
import json, os, sys
targets = json.loads(sys.argv[1])
def attempt(what, fn):
    try:
        fn()
        return "allowed"
    except OSError as exc:
        return type(exc).__name__
def read(path):
    with open(path, "rb") as fh:
        fh.read(1)
def write(path):
    with open(path, "w") as fh:
        fh.write("{}")
out = {name: attempt(name, lambda p=path, k=kind: (read if k == "read" else
                                                   os.listdir if k == "list" else write)(p))
       for name, (kind, path) in targets.items()}
mine = [os.environ["HOME"], os.environ["TMPDIR"], os.environ["SF_OUTPUT_DIR"],
        os.environ["SF_CHECKPOINT_DIR"], os.path.dirname(os.environ["SF_METRICS_FILE"])]
out["own"] = [attempt(p, lambda p=p: write(os.path.join(p, "x"))) for p in mine]
out["id"] = [os.getuid(), os.getgid(), os.getgroups(), os.environ["USER"]]
out["cwd_is_home"] = os.getcwd() == os.environ["HOME"]
print(json.dumps(out), flush=True)
"""


@pytest.fixture
def var_dir(settings, job_dirs):
    """A SF_VAR_DIR holding the server's files as the embedded default lays them out."""
    settings.SF_VAR_DIR = job_dirs
    for name, mode in (("db.sqlite3", 0o644), ("secret_key", 0o600)):
        (job_dirs / name).write_text("server secret")
        (job_dirs / name).chmod(mode)
    for folder in ("snapshots", "logs"):
        (job_dirs / folder).mkdir(mode=0o755)
        (job_dirs / folder / "blob").write_text("server secret")
        (job_dirs / folder / "blob").chmod(0o644)
    return job_dirs


def test_a_job_as_its_team_reaches_nothing_of_the_server_or_of_another_team(
    var_dir, make_team, make_user, team, alice, local_cluster
):
    other_team = make_team("audio")
    bob = make_user("bob", other_team)
    other = python_job(other_team, bob, "import time; open('code.py', 'w'); time.sleep(30)", 0)
    [other_attempt] = start(other)
    other_dir = LocalExecutor(local_cluster).root / other_attempt.job_ref
    run_until(lambda: Job.objects.get(pk=other.pk).status == "RUNNING")
    other_output = var_dir / "runs" / other.run_id
    targets = {
        "ledger": ("read", str(var_dir / "db.sqlite3")),
        "secret key": ("read", str(var_dir / "secret_key")),
        "snapshots": ("read", str(var_dir / "snapshots" / "blob")),
        "logs": ("read", str(var_dir / "logs" / "blob")),
        "var dir": ("list", str(var_dir)),
        "executor state": ("list", str(other_dir.parent)),
        "run outputs": ("list", str(var_dir / "runs")),
        "other's console": ("read", str(other_dir / "console.log")),
        "other's work": ("list", str(other_dir / "work")),
        "other's code": ("read", str(other_dir / "work" / "code.py")),
        "other's outputs": ("list", str(other_output)),
        "worker's environ": ("read", f"/proc/{os.getpid()}/environ"),
        "own exit record": ("write", "../exit.json"),
        "own started record": ("write", "../started.json"),
    }
    job = python_job(team, alice, TRY_EVERYTHING, total_gpus=0)
    job.entrypoint = [*job.entrypoint, json.dumps(targets)]
    job.save(update_fields=["entrypoint"])
    start(job)
    run_until(lambda: Job.objects.get(pk=job.pk).status in {"SUCCEEDED", "FAILED"})
    job.refresh_from_db()
    assert job.status == "SUCCEEDED", job.status_reason
    seen = json.loads(texts(job)[0])
    # Refused, or not there at all: the job's sandbox (sf.sandbox) hides the host's /proc and
    # every other attempt's folders under a masked /tmp.
    refused = {name: seen[name] for name in targets}
    assert refused == {
        name: refused[name] if refused[name] == "FileNotFoundError" else "PermissionError"
        for name in targets
    }
    assert seen["own"] == ["allowed"] * 5
    assert seen["id"] == [200_000 + team.pk, 200_000 + team.pk, [], f"sf-team-{team.pk}"]
    assert seen["cwd_is_home"]
    assert (var_dir / "runs" / job.run_id).stat().st_uid == 200_000 + team.pk


def test_a_named_account_and_none_are_honoured(team, alice, local_cluster):
    local_cluster.settings = {**local_cluster.settings, "run_as": "nobody"}
    local_cluster.save()
    job = python_job(team, alice, "import os; print(os.getuid())", total_gpus=0)
    start(job)
    run_until(lambda: finished(job))
    assert texts(job) == [str(pwd.getpwnam("nobody").pw_uid)]
    local_cluster.settings = {**local_cluster.settings, "run_as": "none"}
    local_cluster.save()
    job = python_job(team, alice, "import os; print(os.getuid())", total_gpus=0)
    start(job)
    run_until(lambda: finished(job))
    assert texts(job) == ["0"]


@pytest.mark.parametrize(
    ("cluster_settings", "message"),
    [
        ({"run_as": "no-such-user-sf"}, "which this host does not have"),
        ({"run_as": "root"}, "unprivileged"),
        ({"run_as": 7}, "user name, 'team' or 'none'"),
        ({"uid_base": 10}, "uid_base must be a whole number of at least 1000"),
    ],
)
def test_run_as_settings_that_cannot_work_are_refused(cluster_settings, message):
    with pytest.raises(ValueError, match=message):
        LocalExecutor.validate_settings(cluster_settings)


def test_good_run_as_settings_pass():
    for good in ({"run_as": "team", "uid_base": 300_000}, {"run_as": ""}, {"run_as": "nobody"}):
        LocalExecutor.validate_settings(good)


@pytest.mark.parametrize("sandbox", ["namespaces", "none"])
def test_the_runner_left_by_a_job_of_another_uid_cannot_be_signalled(
    team, alice, local_cluster, sandbox
):
    local_cluster.settings = {**local_cluster.settings, "sandbox": sandbox}
    local_cluster.save()
    # In its sandbox the job's parent (nsenter, then the runner) is out of sight (getppid 0):
    # the nearest root process it can name is the sandbox's init.
    code = (
        "import os, signal, time\n"
        "try:\n    os.kill(os.getppid() or 1, signal.SIGKILL)\n    print('killed')\n"
        "except PermissionError:\n    print('refused')\n"
    )
    job = python_job(team, alice, code, total_gpus=0)
    start(job)
    run_until(lambda: finished(job))
    time.sleep(0.1)
    assert texts(job) == ["refused"] and Job.objects.get(pk=job.pk).status == "SUCCEEDED"
