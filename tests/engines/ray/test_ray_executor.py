"""The Ray executor against a real Ray head: submit, find, poll, cancel and capacity.

Jobs run the real job-side runner offline. The parity test reads the executor's jobs back with
Ray's own `JobSubmissionClient` (imported here only, never by the server) to show that the
executor speaks the same Jobs API.
"""

import datetime as dt
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from jobs.executors import LaunchError, LaunchSpec
from jobs.executors.ray import RayExecutor, RayUnreachable
from jobs.models import Cluster
from tests.engines.ray.conftest import ROOT, TERMINAL

pytestmark = pytest.mark.ray


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)
    return value


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def test_the_server_side_never_imports_ray():
    code = (
        "import django, sys; django.setup(); import jobs.executors.ray; "
        "sys.exit('ray' in sys.modules)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "starforge.settings"}
    assert subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT).returncode == 0


def test_a_gpu_job_runs_then_succeeds_with_its_gpu_visible(ray_jobs):
    spec = ray_jobs.submit(["sh", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES; sleep 2"], total_gpus=1)
    obs, seen = ray_jobs.wait(spec.name, TERMINAL)
    assert seen[-2:] == ["RUNNING", "SUCCEEDED"], seen
    assert (obs.exit_code, obs.failure, obs.start_time) == (0, "", None)
    assert obs.end_time is not None
    console = (ray_jobs.attempt_dir(spec.name) / "console.log").read_text()
    assert re.fullmatch(r"CVD=[0-3]\n", console), console


def test_failures_come_back_with_the_runners_exit_code(ray_jobs):
    exits = ray_jobs.submit(["sh", "-c", "echo bad input >&2; exit 1"], total_gpus=1)
    killed = ray_jobs.submit(["sh", "-c", "kill -9 $$"], total_gpus=0)
    no_code = ray_jobs.submit(["no-such-program"], total_gpus=0)
    ends = {spec.name: ray_jobs.wait(spec.name, TERMINAL)[0] for spec in (exits, killed, no_code)}

    failed = ends[exits.name]
    assert (failed.native_state, failed.exit_code, failed.failure) == ("FAILED", 1, "exit")
    assert "bad input" in failed.message  # Ray's message carries the log tail
    signalled = ends[killed.name]
    assert (signalled.native_state, signalled.exit_code, signalled.failure) == (
        "FAILED",
        -9,
        "exit",
    )
    ingest = ends[no_code.name]
    assert (ingest.native_state, ingest.exit_code, ingest.failure) == ("FAILED", None, "ingest")
    assert (
        ingest.message == "ingest failed: entrypoint executable 'no-such-program' not found on PATH"
    )


def test_a_second_submit_of_an_attempt_adopts_its_job(ray_jobs, ray_cluster, ray_address):
    from ray.job_submission import JobSubmissionClient

    spec = ray_jobs.submit(["sh", "-c", "echo ran"], total_gpus=0)
    assert ray_jobs.executor.submit(spec) == spec.name
    assert RayExecutor(ray_cluster).submit(spec) == spec.name  # after a worker restart, too
    ray_jobs.wait(spec.name, TERMINAL)
    listed = [job.submission_id for job in JobSubmissionClient(ray_address).list_jobs()]
    assert listed.count(spec.name) == 1
    assert (ray_jobs.attempt_dir(spec.name) / "console.log").read_text() == "ran\n"


def test_cancel_stops_a_running_job_and_leaves_no_process(ray_jobs, tmp_path):
    proc_file = tmp_path / "runner.json"
    spec = ray_jobs.submit(["sleep", "60"], total_gpus=1, SF_PROC_FILE=str(proc_file))
    ray_jobs.wait(spec.name, {"RUNNING"})
    started = ray_jobs.attempt_dir(spec.name) / "started.json"
    child = wait_for(lambda: started.exists() and json.loads(started.read_text()), 30, "started")
    runner = json.loads(proc_file.read_text())["pid"]
    assert not gone(runner) and not gone(child["pid"])

    ray_jobs.executor.cancel(spec.name)
    ray_jobs.executor.cancel(spec.name)  # idempotent
    obs, _ = ray_jobs.wait(spec.name, TERMINAL)
    assert obs.native_state == "STOPPED"
    wait_for(lambda: gone(runner) and gone(child["pid"]), 20, "the runner and its job to end")
    ray_jobs.executor.cancel(spec.name)  # a finished job: nothing to do
    ray_jobs.executor.cancel(f"sf-{uuid.uuid4().hex}-a1")  # a job Ray never knew: fine


def test_poll_asks_ray_once_for_all_the_jobs(ray_jobs, monkeypatch):
    first = ray_jobs.submit(["true"], total_gpus=0)
    second = ray_jobs.submit(["true"], total_gpus=0)
    unknown = f"sf-{uuid.uuid4().hex}-a1"
    calls = []
    request = http.client.HTTPConnection.request

    def counted(self, method, url, *args, **kwargs):
        calls.append((method, url))
        return request(self, method, url, *args, **kwargs)

    monkeypatch.setattr(http.client.HTTPConnection, "request", counted)
    found = ray_jobs.executor.poll([first.name, second.name, unknown])
    assert calls == [("GET", "/api/jobs/")]
    # Other jobs on the cluster (earlier tests') are ignored; unknown refs are simply absent.
    assert set(found) == {first.name, second.name}


def test_a_job_asking_more_gpus_than_exist_stays_pending_with_rays_words(ray_jobs):
    spec = ray_jobs.submit(["true"], total_gpus=8)
    time.sleep(2)
    obs = ray_jobs.executor.poll([spec.name])[spec.name]
    assert obs.native_state == "PENDING"
    assert "waiting for resources" in obs.message, obs.message
    # Ray queues the stop on the job's supervisor actor, which cannot start: the job stays
    # PENDING until RAY_JOB_START_TIMEOUT_SECONDS fails it (documented on `cancel`).
    ray_jobs.executor.cancel(spec.name)
    assert ray_jobs.executor.poll([spec.name])[spec.name].native_state == "PENDING"


def test_a_request_ray_refuses_is_a_permanent_launch_error(ray_jobs, monkeypatch):
    spec = ray_jobs.spec(["true"], total_gpus=0)
    build = RayExecutor._job_request

    def bad_metadata(self, spec):
        return {**build(self, spec), "metadata": {"sf_attempt": 1}}

    monkeypatch.setattr(RayExecutor, "_job_request", bad_metadata)
    with pytest.raises(LaunchError) as refused:
        ray_jobs.executor.submit(spec)
    assert refused.value.permanent
    assert str(refused.value) == (
        "Ray refused the job: TypeError: metadata values must be strings, got <class 'int'>"
    )
    assert ray_jobs.executor.find(spec.name) is None


def test_capacity_subtracts_the_gpus_others_hold_but_not_this_clusters(ray_jobs, ray_address):
    from ray.job_submission import JobSubmissionClient

    executor = ray_jobs.executor
    wait_for(lambda: executor.capacity().total_gpus == 4, 60, "4 free GPUs")
    ours = ray_jobs.submit(["sleep", "60"], total_gpus=2)
    client = JobSubmissionClient(ray_address)
    theirs = client.submit_job(
        entrypoint="sleep 60", entrypoint_num_gpus=1, submission_id=f"other-{uuid.uuid4().hex}"
    )
    try:
        ray_jobs.wait(ours.name, {"RUNNING"})
        # Ray's resource report lags a few seconds behind the jobs.
        wait_for(lambda: executor.capacity().total_gpus == 3, 60, "3 GPUs: 4 less theirs")
    finally:
        client.stop_job(theirs)
    capacity = executor.capacity()
    assert capacity.reachable and not capacity.virtual


def test_a_dead_address_is_unreachable_with_a_sentence():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"http://127.0.0.1:{port}"
    executor = RayExecutor(Cluster(name="ray-dead", kind="ray", settings={"address": address}))
    capacity = executor.capacity()
    assert not capacity.reachable
    assert capacity.message == f"cannot reach the Ray dashboard at {address}: Connection refused"
    with pytest.raises(LaunchError) as launch:
        executor.submit(
            LaunchSpec(
                name="sf-x-a1", job_id=0, run_id="x", attempt=1, total_gpus=0, entrypoint=[], env={}
            )
        )
    assert not launch.value.permanent and "Connection refused" in str(launch.value)
    with pytest.raises(RayUnreachable):
        executor.poll(["sf-x-a1"])


def test_the_executor_speaks_the_jobs_api_of_rays_own_client(ray_jobs, ray_address):
    from ray.job_submission import JobStatus, JobSubmissionClient

    spec = ray_jobs.submit(["sh", "-c", "echo hello"], total_gpus=1)
    obs, _ = ray_jobs.wait(spec.name, TERMINAL)
    client = JobSubmissionClient(ray_address)
    info = client.get_job_info(spec.name)
    assert info.status == JobStatus(obs.native_state) == JobStatus.SUCCEEDED
    assert info.submission_id == spec.name
    # Ray's own times (ms since the epoch) are the engine's record of the attempt.
    assert (obs.engine_start, obs.engine_end) == (
        dt.datetime.fromtimestamp(info.start_time / 1000, dt.UTC),
        dt.datetime.fromtimestamp(info.end_time / 1000, dt.UTC),
    )
    sent = ray_jobs.executor._job_request(spec)["runtime_env"]
    assert info.runtime_env == sent
    assert info.metadata == {
        "sf_cluster": "ray-ci",
        "sf_run_id": spec.run_id,
        "sf_attempt": "1",
        "sf_job_id": "0",
        "sf_team": "vision",
        "sf_gpus": "1",
    }
    assert spec.name in {job.submission_id for job in client.list_jobs()}
    assert ray_jobs.executor.find(spec.name) == spec.name
    # And the other way round: a job Ray's client submitted is one the executor can see.
    other = client.submit_job(entrypoint="true", submission_id=f"other-{uuid.uuid4().hex}")
    assert ray_jobs.executor.find(other) == other
    assert ray_jobs.executor.find(f"sf-{uuid.uuid4().hex}-a1") is None


def test_live_lists_the_unfinished_jobs_this_cluster_launched(ray_jobs):
    done = ray_jobs.submit(["true"], total_gpus=0)
    ray_jobs.wait(done.name, TERMINAL)
    busy = ray_jobs.submit(["sleep", "60"], total_gpus=0)
    ray_jobs.wait(busy.name, {"RUNNING"})
    try:
        held = ray_jobs.executor.starforge_objects()
        assert (held[busy.name].native_state, held[busy.name].name) == ("RUNNING", busy.name)
        assert done.name not in held
    finally:
        ray_jobs.executor.cancel(busy.name)
