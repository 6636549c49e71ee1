"""The Slurm executor against a real slurmctld + slurmd (4 fake GPUs): submit, adopt, poll,
cancel and capacity, with the job-side runner as the batch step (offline: no API server).
"""

import dataclasses
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from jobs.executors import LaunchError
from jobs.executors.slurm import SlurmExecutor
from jobs.executors.slurm.commands import SlurmError, run_command
from jobs.models import Cluster
from tests.engines.slurm.conftest import slurm
from tests.engines.slurm.helpers import FINAL, attempt_dir, python_spec, wait_for

pytestmark = pytest.mark.slurm


def counting(executor: SlurmExecutor) -> list[str]:
    """The names of the Slurm commands the executor runs from now on."""
    commands: list[str] = []

    def run(argv, env, fds):
        commands.append(os.path.basename(argv[0]))
        return run_command(argv, env, fds)

    executor._run = run
    return commands


def test_a_two_gpu_job_runs_with_its_gpus_and_only_the_job_environment(
    executor, token, monkeypatch
):
    monkeypatch.setenv("SF_SERVER_SECRET", "the server's environment must not reach jobs")
    code = "import json, os; json.dump(dict(os.environ), open('env.json', 'w')); print('hello')"
    spec = python_spec(
        token, "gpu2", code, total_gpus=2, COMMA_AND_LINES="a,b\nc", SBATCH_GRES="gpu:4"
    )
    ref = executor.submit(spec)
    seen = wait_for(executor, ref, FINAL)
    final = seen[-1]
    assert final.native_state == "COMPLETED", final
    assert {o.native_state for o in seen} <= {"PENDING", "RUNNING", "COMPLETING", "COMPLETED"}
    assert final.exit_code == 0
    assert final.start_time and final.end_time and final.start_time.utcoffset().seconds == 0
    job_env = json.loads((attempt_dir(executor, spec) / "work" / "env.json").read_text())
    assert job_env["CUDA_VISIBLE_DEVICES"] == "0,1"  # SBATCH_GRES in the job's env changed nothing
    assert job_env["COMMA_AND_LINES"] == "a,b\nc"
    assert "SF_SERVER_SECRET" not in job_env
    assert (attempt_dir(executor, spec) / "console.log").read_text() == "hello\n"


def test_exit_codes_and_signals_of_the_entrypoint_come_back(executor, token):
    exits = executor.submit(python_spec(token, "exit3", "raise SystemExit(3)"))
    killed = executor.submit(
        python_spec(token, "kill9", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    )
    assert wait_for(executor, exits, FINAL)[-1].native_state == "FAILED"
    assert wait_for(executor, killed, FINAL)[-1].native_state == "FAILED"
    found = executor.poll([exits, killed])
    assert (found[exits].exit_code, found[exits].failure) == (3, "exit")
    assert (found[killed].exit_code, found[killed].failure) == (-9, "exit")


def test_a_job_wanting_more_gpus_than_are_free_waits_for_resources(executor, token, idle_gpus):
    hog = executor.submit(python_spec(token, "hog", "import time; time.sleep(60)", total_gpus=4))
    wait_for(executor, hog, {"RUNNING"})
    waiting = executor.submit(python_spec(token, "wait", "pass", total_gpus=1))
    deadline = time.monotonic() + 10
    while (obs := executor.poll([waiting])[waiting]).message != "Resources":
        assert time.monotonic() < deadline, f"still {obs.native_state} {obs.message!r}"
        time.sleep(0.2)
    assert obs.native_state == "PENDING"
    assert SlurmExecutor.STATE_TABLE[obs.native_state] == "PENDING"


def test_more_gpus_than_the_node_has_is_refused_for_good(executor, token):
    with pytest.raises(LaunchError) as refused:
        executor.submit(python_spec(token, "gpu8", "pass", total_gpus=8))
    assert refused.value.permanent
    assert str(refused.value) == "sbatch: Requested node configuration is not available"


def test_cancel_ends_the_job_and_every_process_it_started(executor, token):
    spec = python_spec(token, "sleep", "import time; time.sleep(120)")
    ref = executor.submit(spec)
    wait_for(executor, ref, {"RUNNING"})
    started = attempt_dir(executor, spec) / "started.json"
    deadline = time.monotonic() + 10
    while not started.exists():
        assert time.monotonic() < deadline, "the runner never started the entrypoint"
        time.sleep(0.05)
    pid = json.loads(started.read_text())["pid"]
    executor.cancel(ref)
    final = wait_for(executor, ref, FINAL)[-1]
    assert final.native_state == "CANCELLED"
    assert SlurmExecutor.STATE_TABLE["CANCELLED"] == "STOPPED"
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}"):
        assert time.monotonic() < deadline, f"entrypoint {pid} outlived the cancel"
        time.sleep(0.1)
    executor.cancel(ref)  # again, and an id Slurm never had: both are no-ops
    executor.cancel("99999999")


def test_submitting_the_same_attempt_again_adopts_the_first_slurm_job(
    executor, token, cluster_settings, slurm_conf
):
    spec = python_spec(token, "once", "import time; time.sleep(30)")
    commands = counting(executor)
    first = executor.submit(spec)
    assert commands == ["sbatch"]  # a fresh attempt (no attempt dir yet) asks nothing first
    assert executor.submit(spec) == first
    assert commands == ["sbatch", "squeue"]  # Slurm's job of that name answers
    (attempt_dir(executor, spec) / "slurm_job_id").write_text("1")  # the job's own words
    assert executor.find(spec.name) == first
    elsewhere = {**cluster_settings, "work_dir": str(attempt_dir(executor, spec).parent / "x")}
    other_host = SlurmExecutor(Cluster(name="slurm-test", kind="slurm", settings=elsewhere))
    assert other_host.find(spec.name) == first  # by name, from any worker's disk
    listed = slurm("squeue", "-h", "-t", "all", "-n", spec.name, "-o", "%i", conf=slurm_conf)
    assert listed.split() == [first]
    assert executor.find(f"sf-{token}never-a1") is None


def test_two_workers_submitting_the_same_attempt_at_once_make_one_job(
    token, cluster_settings, slurm_conf
):
    spec = python_spec(token, "race", "import time; time.sleep(30)")
    refs: list[str] = []

    def worker() -> None:
        cluster = Cluster(name="slurm-test", kind="slurm", settings=cluster_settings)
        refs.append(SlurmExecutor(cluster).submit(spec))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    listed = slurm("squeue", "-h", "-t", "all", "-n", spec.name, "-o", "%i", conf=slurm_conf)
    assert len(set(refs)) == 1 and listed.split() == refs[:1]


def test_a_time_limit_reaches_slurm_as_its_backstop_in_whole_minutes(executor, token, slurm_conf):
    spec = python_spec(token, "limit", "import time; time.sleep(30)")
    limited = dataclasses.replace(spec, time_limit_s=90)  # + 60 s backstop: 150 s, 3 minutes
    ref = executor.submit(limited)
    try:
        assert slurm("squeue", "-h", "-j", ref, "-o", "%l", conf=slurm_conf).strip() == "3:00"
    finally:
        executor.cancel(ref)


def test_poll_asks_squeue_once_for_all_jobs(executor, token):
    refs = [executor.submit(python_spec(token, f"p{i}", "pass")) for i in range(3)]
    commands = counting(executor)
    found = executor.poll(refs)
    assert sorted(found) == sorted(refs)
    assert commands == ["squeue"]
    # A job Slurm forgot is simply absent (sacct, the fallback, has no accounting here).
    commands.clear()
    assert sorted(executor.poll([*refs, "99999999"])) == sorted(refs)
    assert executor.poll(["99999999"]) == {}
    assert commands == ["squeue", "sacct", "squeue", "sacct"]


def test_capacity_is_the_gres_gpus_less_those_foreign_jobs_hold(
    executor, token, slurm_conf, idle_gpus, tmp_path
):
    assert executor.capacity().total_gpus == 4
    foreign = slurm(
        "sbatch", "--parsable", f"--job-name=train-{token}", "--gres=gpu:2",
        f"--output={tmp_path}/foreign.out", "--wrap=sleep 60", conf=slurm_conf,
    ).strip()  # fmt: skip
    ours = executor.submit(python_spec(token, "ours", "import time; time.sleep(60)", total_gpus=1))
    wait_for(executor, foreign, {"RUNNING"})
    wait_for(executor, ours, {"RUNNING"})
    capacity = executor.capacity()
    # the scheduler takes off Starforge's own GPUs itself: only the foreign job's 2 count here
    assert capacity.reachable and capacity.total_gpus == 2


def test_an_unreachable_controller_is_reported_not_guessed(executor, token, slurm_conf, tmp_path):
    conf = Path(slurm_conf).read_text()
    wrong = [
        "SlurmctldPort=6899" if line.startswith("SlurmctldPort=") else line
        for line in conf.splitlines()
    ]
    (tmp_path / "slurm.conf").write_text("\n".join([*wrong, "MessageTimeout=1", ""]))
    (tmp_path / "gres.conf").write_text((Path(slurm_conf).parent / "gres.conf").read_text())
    cluster = Cluster(
        name="slurm-down",
        kind="slurm",
        settings={"work_dir": str(tmp_path / "work"), "slurm_conf": str(tmp_path / "slurm.conf")},
    )
    down = SlurmExecutor(cluster)
    capacity = down.capacity()
    assert not capacity.reachable
    assert "Unable to contact slurm controller" in capacity.message
    with pytest.raises(LaunchError) as refused:
        down.submit(python_spec(token, "nowhere", "pass"))
    assert not refused.value.permanent
    with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
        down.poll(["1", "2"])


def test_the_ci_script_is_idempotent_and_reports_status(slurm_conf):
    script = Path(__file__).resolve().parents[3] / ".ci" / "slurm.sh"
    again = subprocess.run([script, "up"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "slurm up" in again.stdout
    assert subprocess.run([script, "status"]).returncode == 0


def test_live_lists_this_users_unfinished_starforge_jobs_only(
    executor, token, slurm_conf, tmp_path
):
    running = executor.submit(python_spec(token, "live", "import time; time.sleep(60)"))
    done = executor.submit(python_spec(token, "done", "pass"))
    foreign = slurm(
        "sbatch", "--parsable", f"--job-name=train-{token}", f"--output={tmp_path}/f.out",
        "--wrap=sleep 60", conf=slurm_conf,
    ).strip()  # fmt: skip
    wait_for(executor, done, FINAL)
    wait_for(executor, running, {"RUNNING"})
    try:
        held = executor.starforge_objects()
        assert held[running].name == f"sf-{token}live-a1"
        assert held[running].native_state == "RUNNING"
        assert done not in held and foreign not in held
    finally:
        executor.cancel(running)
        slurm("scancel", foreign, conf=slurm_conf)
