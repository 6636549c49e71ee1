"""Trust boundaries of the Ray executor against a real Ray head (issue 12).

The job's environment is an allow-list (docs/ARCHITECTURE.md, invariant 8): neither the submitting
server's environment nor the raylet's reaches it; the submission (which Ray shows to anyone who
can reach the dashboard) carries no job token or record key; a stop leaves no process behind.
"""

import json
import os
import time
import urllib.request

import pytest

from jobs.executors.base import GPU_VISIBILITY_VARS
from jobs.executors.ray import RAY_PROVIDED
from tests.engines.ray.conftest import TERMINAL

pytestmark = pytest.mark.ray
PLANTED = {"DATABASE_URL": "postgres://leak", "SF_SECRET_KEY": "leak-key"}
RUNNER_ADDS = {
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "SF_METRICS_FILE",
    "SF_NOTICE_FILE",
    "SF_PREEMPT_GRACE_S",
}  # client/sf/environment.py, child_env
DUMP = "import json, os; json.dump(dict(os.environ), open('env.json', 'w'))"


def raylet_env(ray_address) -> dict[str, str]:
    """The environment a bare entrypoint gets from this Ray cluster (no Starforge wrapper)."""
    body = json.dumps({"entrypoint": "env -0", "runtime_env": {}}).encode()
    request = urllib.request.Request(
        f"{ray_address}/api/jobs/", data=body, headers={"Content-Type": "application/json"}
    )
    job_id = json.loads(urllib.request.urlopen(request, timeout=10).read())["submission_id"]
    deadline = time.monotonic() + 60
    while True:
        info = json.loads(urllib.request.urlopen(f"{ray_address}/api/jobs/{job_id}").read())
        if info["status"] in TERMINAL:
            break
        assert time.monotonic() < deadline
        time.sleep(0.3)
    logs = json.loads(urllib.request.urlopen(f"{ray_address}/api/jobs/{job_id}/logs").read())
    pairs = [p.partition("=") for p in logs["logs"].split("\0") if "=" in p]
    return {name.rsplit("\n", 1)[-1]: value for name, _, value in pairs}


def test_neither_the_servers_nor_the_raylets_environment_reaches_a_job(
    ray_jobs, ray_address, monkeypatch
):
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)
    node = raylet_env(ray_address)
    # The REST API sends none of the submitter's variables. (The raylet may have names of its
    # own that look alike: a Ray head started by the test session inherits its environment.)
    assert "PATH" in node and not {k for k, v in PLANTED.items() if node.get(k) == v}
    spec = ray_jobs.submit(
        ["python", "-c", DUMP], total_gpus=1, OWN_VAR="mine", CUDA_VISIBLE_DEVICES="0,1,2,3"
    )
    obs, _ = ray_jobs.wait(spec.name, TERMINAL)
    assert obs.native_state == "SUCCEEDED", obs
    env = json.loads((ray_jobs.attempt_dir(spec.name) / "work" / "env.json").read_text())
    assert not {k for k, v in env.items() if k in PLANTED or "leak" in v}
    assert env["OWN_VAR"] == "mine"
    assert env["CUDA_VISIBLE_DEVICES"] in {"0", "1", "2", "3"}  # Ray's one GPU, not the job's 4
    sent = ray_jobs.executor._job_request(spec)["runtime_env"]["env_vars"]
    allowed = (set(sent) - {"SF_ENV_KEEP"}) | RAY_PROVIDED | RUNNER_ADDS
    assert not set(env) - allowed, f"not from the allow-list: {sorted(set(env) - allowed)}"
    raylets_own = {k for k in node if k not in allowed}
    assert raylets_own and not raylets_own & set(env)  # e.g. the raylet's SHELL, its HOME
    assert env["HOME"] == str(ray_jobs.attempt_dir(spec.name) / "work")


def test_no_job_token_or_record_key_is_readable_through_the_job_list(ray_jobs, ray_address):
    assert ray_jobs.executor.BOOTSTRAP_TOKEN is True
    spec = ray_jobs.submit(
        ["true"],
        total_gpus=0,
        SF_JOB_TOKEN="job-token-secret",
        SF_RECORD_KEY="record-key-secret",
        SF_BOOTSTRAP_TOKEN="one-time",
    )
    ray_jobs.wait(spec.name, TERMINAL)
    listed = urllib.request.urlopen(f"{ray_address}/api/jobs/", timeout=10).read().decode()
    assert spec.name in listed
    assert "job-token-secret" not in listed and "record-key-secret" not in listed
    mine = next(j for j in json.loads(listed) if j.get("submission_id") == spec.name)
    env_vars = mine["runtime_env"]["env_vars"]
    assert "SF_JOB_TOKEN" not in env_vars and "SF_RECORD_KEY" not in env_vars
    assert env_vars["SF_BOOTSTRAP_TOKEN"] == "one-time"


def test_a_job_cannot_set_gpu_visibility(ray_jobs):
    spec = ray_jobs.spec(["true"], total_gpus=0, **dict.fromkeys(GPU_VISIBILITY_VARS, "all"))
    env_vars = ray_jobs.executor._job_request(spec)["runtime_env"]["env_vars"]
    assert not GPU_VISIBILITY_VARS & set(env_vars)


# A job that leaves processes behind: one in its own process group ignoring SIGTERM, one that
# left it (setsid) and one that also left the process tree (double fork: re-parented to init).
SPAWN = r"""
import json, os, signal, subprocess, sys, time
stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
same_group = subprocess.Popen([sys.executable, "-c", stubborn])
new_session = subprocess.Popen([sys.executable, "-c", stubborn], start_new_session=True)
daemon = subprocess.Popen(
    [sys.executable, "-c",
     "import os, subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]],"
     " start_new_session=True); print(p.pid, flush=True); os._exit(0)", stubborn],
    stdout=subprocess.PIPE, text=True,
)
orphan = int(daemon.stdout.readline())
pids = {"same_group": same_group.pid, "new_session": new_session.pid, "orphan": orphan}
json.dump(pids, open("pids.json", "w"))
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_stop_ends_the_entrypoints_whole_process_tree(ray_jobs):
    spec = ray_jobs.submit(["python", "-c", SPAWN], total_gpus=0)
    pids_file = ray_jobs.attempt_dir(spec.name) / "work" / "pids.json"
    deadline = time.monotonic() + 60
    while not pids_file.exists():
        assert time.monotonic() < deadline, "the job never started its processes"
        time.sleep(0.2)
    time.sleep(0.5)
    pids = json.loads(pids_file.read_text())
    assert all(alive(pid) for pid in pids.values())
    try:
        ray_jobs.executor.cancel(spec.name)
        obs, _ = ray_jobs.wait(spec.name, TERMINAL, timeout=60)
        assert obs.native_state == "STOPPED"
        deadline = time.monotonic() + 30
        while any(alive(p) for p in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = {name: pid for name, pid in pids.items() if alive(pid)}
        assert not left, f"left running after the stop: {left}"
    finally:
        for pid in pids.values():
            if alive(pid):
                os.kill(pid, 9)
