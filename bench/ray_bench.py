"""Ray: the same short jobs through Starforge and straight through Ray's Jobs API, side by side,
on the Ray head of `.ci/ray.sh` (started when none answers, and stopped afterwards only then).

Each job is the job-side runner running `python -c pass`, offline (no API server), with no
GPUs. Starforge: `submit_job` in a process of its own, the `launch` task's `launch_attempts()` on
a worker thread, beat's two ticks on two threads (`slurm_bench._through_starforge`, the same
loop as the Slurm comparison). Jobs API: a thread submits with
`ray.job_submission.JobSubmissionClient.submit_job`, the main thread lists the jobs once per
loop with the same LOOP_SLEEP_S sleep. A job is done when its loop first sees it so. Three runs
in turn; the aim is a median submit→done <= 1.25x the Jobs API's.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from bench import common, slurm_bench

RAY_SH = common.ROOT / ".ci" / "ray.sh"


@contextlib.contextmanager
def ray_up():
    """The dashboard URL of a running Ray head; stops it afterwards if this started it."""
    up = subprocess.run([RAY_SH, "up"], capture_output=True, text=True, timeout=180, check=True)
    url = subprocess.run([RAY_SH, "url"], capture_output=True, text=True, check=True).stdout
    try:
        yield url.strip()
    finally:
        if up.stdout.startswith("ray up"):
            subprocess.run([RAY_SH, "down"], capture_output=True, timeout=60)


def vs_jobs_api(n: int = 8, runs: int = 3) -> dict:
    import os

    from django.conf import settings

    from jobs.executors.ray import RayExecutor
    from jobs.models import Cluster, Membership

    settings.SF_API_URL = ""  # offline runners: this compares orchestration, not log shipping
    var = Path(os.environ["SF_VAR_DIR"])
    with ray_up() as url:
        cluster = Cluster.objects.create(
            name="ray-bench", kind="ray", settings={"address": url, "work_dir": str(var / "ray")}
        )
        user = common.make_user()
        [team] = common.make_teams(1, quota=10_000, cluster=cluster)
        Membership.objects.create(team=team, user=user, role="member")
        executor = RayExecutor(cluster)

        def stop(refs: list[str]) -> None:
            for ref in refs:
                with contextlib.suppress(Exception):
                    executor.cancel(ref)

        each = []
        for i in range(runs):
            direct = _through_jobs_api(n, url, var / f"jobs-api{i}")
            ours = slurm_bench._through_starforge(n, 0, cluster, team, user, cleanup=stop)
            ratio = {
                key: round(ours[key] / direct[key], 2) if direct[key] else None
                for key in ("makespan_s", "running_median_s", "done_median_s")
            }
            each.append({"jobs_api": direct, "starforge": ours, "ratio": ratio})
    middle = sorted(each, key=lambda run: run["ratio"]["done_median_s"] or 0)[runs // 2]
    return {
        "jobs": n,
        "loop_sleep_s": slurm_bench.LOOP_SLEEP_S,
        "runs": runs,
        **middle,
        "ratio_each": [run["ratio"] for run in each],
        "each": each,
    }


def _through_jobs_api(n: int, url: str, work: Path) -> dict:
    from ray.job_submission import JobSubmissionClient
    from sf.contract import file_env

    client = JobSubmissionClient(url)
    tag = uuid.uuid4().hex[:8]
    base = {
        "SF_API_URL": "",
        "SF_SNAPSHOT": "",
        "SF_ENTRYPOINT": json.dumps(["python", "-c", "pass"]),
    }
    runner = f"exec {sys.executable} -m sf.runner"
    submitted: dict[str, float] = {}

    def submit_all() -> None:
        for i in range(n):
            run_dir = work / f"bl-{tag}-{i}"
            t = time.time()
            name = client.submit_job(
                submission_id=f"bl-{tag}-{i}",
                entrypoint=f"mkdir -p {run_dir} && cd {run_dir} && {runner}",
                runtime_env={"env_vars": {**base, **file_env(run_dir)}},
            )
            submitted[name] = t

    thread = threading.Thread(target=submit_all)
    thread.start()
    running: dict[str, float] = {}
    done: dict[str, float] = {}
    deadline = time.monotonic() + slurm_bench.TIMEOUT_S
    try:
        while thread.is_alive() or len(done) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Jobs API run: {len(done)} of {n} done in time")
            now = time.time()
            for job in client.list_jobs():
                name, state = job.submission_id, str(job.status)
                if name not in submitted:
                    continue
                if state in ("RUNNING", "SUCCEEDED"):
                    running.setdefault(name, now)
                if state == "SUCCEEDED":
                    done.setdefault(name, now)
                elif state in ("FAILED", "STOPPED"):
                    raise RuntimeError(f"Jobs API job {name} ended {state}: {job.message}")
            time.sleep(slurm_bench.LOOP_SLEEP_S)
    finally:
        thread.join()
        for name in set(submitted) - set(done):
            with contextlib.suppress(Exception):
                client.stop_job(name)
    return slurm_bench._figures(submitted, running, done)
