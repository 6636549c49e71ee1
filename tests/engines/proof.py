"""The end-to-end proof every engine passes, on the real stack against that engine.

Each engine's `test_e2e.py` starts its engine, then `EngineProof` starts the stack (ASGI server,
Celery worker and beat; embedded SQLite ledger; Redis), adds a cluster of that kind as the demo
team's default with `manage.py cluster add`, and drives jobs through the `sf` CLI exactly as a
user would. The engine-specific parts are two callbacks: `alive(job_ref)` says whether the
engine still runs (or would still start) that backend object, and for engines that report
out-of-memory kills, a way to cause one. Nothing here mocks Starforge.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.stack import ROOT, Stack, sf_command, steps_printed, wait_until

ACTIVE = {"QUEUED", "SUBMITTED", "PENDING", "RUNNING"}
SHOW_GPUS = """\
import os
print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
"""


# Team lab lends its idle quota on the proof's cluster; the demo team has none of its own and
# may borrow 2 GPUs. Prints a token of lab's member lea. LENDER_GONE puts demo back as it was.
LENDER = """\
from django.contrib.auth.models import User
from jobs.actions.tokens import issue_token
from jobs.models import Cluster, Membership, Team
Team.objects.filter(name="demo").update(gpu_quota=0, borrow_cap=2)
lab = Team.objects.create(
    name="lab", gpu_quota=2, lendable=True, default_cluster=Cluster.objects.get(name="{cluster}")
)
lea = User.objects.create_user("lea")
Membership.objects.create(team=lab, user=lea)
print(issue_token(lea))
"""
LENDER_GONE = """\
from jobs.models import Team
Team.objects.filter(name="demo").update(gpu_quota=4, borrow_cap=None)
Team.objects.filter(name="lab").update(lendable=False)
"""


class EngineProof:
    """The stack plus an `sf` client logged in as the demo user, submitting to one cluster."""

    def __init__(self, stack: Stack, home: Path, cluster: str, alive: Callable[[str], bool]):
        self.stack = stack
        self.cluster = cluster
        self.alive = alive
        self.submitted: list[int] = []
        workdir = home / "project"
        self.home, self.workdir = home, workdir
        shutil.copytree(ROOT / "examples", workdir)
        (workdir / "show_gpus.py").write_text(SHOW_GPUS)
        (workdir / ".sfignore").write_text("checkpoints/\n")
        self.sf = sf_command(workdir, home / "sf.json")
        self.sf("login", "--url", stack.url, "--token", stack.token)

    # -- driving it -------------------------------------------------------------------------
    def submit(self, *args: str) -> dict:
        job = json.loads(self.sf("submit", "--json", "--cluster", self.cluster, *args).stdout)
        self.submitted.append(job["id"])
        return job

    def wait(self, job_id: int, ready: Callable[[dict], bool], what: str, timeout=90) -> dict:
        return self.stack.wait_job(job_id, ready, timeout, what)

    def wait_status(self, job_id: int, status: str, timeout: float = 90) -> dict:
        return self.wait(job_id, lambda j: j["status"] == status, status, timeout)

    def logs(self, job_id: int) -> list[str]:
        done = self.sf("job", "logs", str(job_id), "-n", "0", "--no-follow", timeout=60)
        return done.stdout.splitlines()

    def verb(self, verb: str, job_id: int) -> dict:
        return json.loads(self.sf("job", verb, str(job_id), "--json").stdout)

    def wait_gone(self, job_ref: str, timeout: float = 60) -> None:
        wait_until(
            lambda: not self.alive(job_ref),
            timeout,
            f"backend object {job_ref} to be gone",
            self.stack.diagnostics,
            interval=0.5,
        )

    def events(self, job_id: int) -> list[dict]:
        return self.stack.api(f"/jobs/{job_id}/events")

    # -- the proof, step by step ------------------------------------------------------------
    def succeeds_with_gpus(self, gpus: int, expect_devices: str | None) -> dict:
        """The example training job runs on `gpus` GPUs to SUCCEEDED, metered from RUNNING."""
        # 8 steps of 0.25 s: Kubernetes times an end to the second, so a run that starts and
        # ends inside one second is billed 0 s (its end bounded by its start) and start < end
        # below would fail by chance; at 2 s it cannot.
        train = ["python", "train.py", "--steps", "8", "--sleep", "0.25"]
        job = self.submit("--gpus", str(gpus), "--", *train)
        done = self.wait_status(job["id"], "SUCCEEDED")  # the events below show it RUNNING
        lines = self.logs(job["id"])
        assert steps_printed(lines) == list(range(1, 9)) and lines[-1] == "done", lines
        (attempt,) = self.stack.attempts(job["id"])
        assert attempt["exit_code"] == 0 and attempt["gpus"] == gpus
        start, end = _ts(attempt["start_time"]), _ts(attempt["end_time"])
        assert _ts(attempt["submitted_at"]) <= start < end
        running_s = (end - start).total_seconds()
        assert abs(attempt["gpu_seconds"] - running_s * gpus) <= 2e-3 * gpus, attempt
        statuses = [e["to_status"] for e in self.events(job["id"]) if e["kind"] == "status"]
        assert statuses == ["QUEUED", "SUBMITTED", "PENDING", "RUNNING", "SUCCEEDED"], statuses
        if expect_devices is not None:
            shown = self.submit("--gpus", str(gpus), "--", "python", "show_gpus.py")
            self.wait_status(shown["id"], "SUCCEEDED")
            assert self.logs(shown["id"]) == [f"CUDA_VISIBLE_DEVICES={expect_devices}"]
        self.wait_gone(attempt["job_ref"])
        return done

    def pauses_and_resumes(self) -> None:
        """Pause ends the backend object; resume runs attempt 2 from the latest checkpoint."""
        job = self.submit(
            "--gpus", "1", "--", "python", "train.py", "--steps", "30", "--sleep", "0.3"
        )
        job_id = job["id"]
        self.wait_status(job_id, "RUNNING")
        wait_until(
            lambda: max(steps_printed(self.logs(job_id)), default=0) >= 7,
            60,
            "step 7 in the logs",
            self.stack.diagnostics,
        )
        paused = self.verb("pause", job_id)
        assert paused["status"] == "PAUSED"
        self.wait_gone(paused["job_ref"])
        # The pause's SIGTERM is a notice: the job saved the step it was at, and exited. Its
        # last lines may arrive after the backend object is gone (a deleted Kubernetes Job
        # vanishes at once while its pod's process still flushes), never long after.
        wait_until(
            lambda: any(line.startswith("notice received") for line in self.logs(job_id)),
            30,
            "the job's notice line in the logs",
            self.stack.diagnostics,
        )
        before = self.logs(job_id)
        checkpoint = max(steps_printed(before))
        assert f"notice received: checkpointed step {checkpoint}, exiting" in before, before
        assert 7 <= checkpoint < 30, before
        assert self.stack.job(job_id)["status"] == "PAUSED"

        self.sf("job", "resume", str(job_id))
        self.wait(job_id, lambda j: j["attempt"] == 2 and j["status"] == "RUNNING", "resumed")
        self.wait_status(job_id, "SUCCEEDED", timeout=120)
        lines = self.logs(job_id)
        assert f"resuming from step {checkpoint}" in lines and lines[-1] == "done", lines
        resumed = lines[lines.index(f"resuming from step {checkpoint}") + 1 :]
        assert steps_printed(resumed) == list(range(checkpoint + 1, 31))
        first, second = self.stack.attempts(job_id)
        assert first["end_reason"].startswith("paused by") and second["exit_code"] == 0
        assert first["job_ref"] != second["job_ref"]
        assert (self.stack.job(job_id)["run_id"], self.stack.job(job_id)["retry_count"]) == (
            job["run_id"],
            0,
        )

    def fails_with_exit_code(self, code: int = 1) -> dict:
        job = self.submit("--gpus", "1", "--", "python", "-c", f"import sys; sys.exit({code})")
        failed = self.wait_status(job["id"], "FAILED")
        (attempt,) = self.stack.attempts(job["id"])
        assert attempt["exit_code"] == code and attempt["failure"] == "exit", attempt
        assert failed["status_reason"].startswith(f"exited with code {code}"), failed
        self.wait_gone(attempt["job_ref"])
        return failed

    def fails_out_of_memory(self, kill: Callable[[str], None]) -> dict:
        """`kill(job_ref)` makes the engine end the job as out of memory, as it reports it."""
        job = self.submit("--gpus", "1", "--", "python", "train.py", "--steps", "500")
        running = self.wait_status(job["id"], "RUNNING")
        kill(running["job_ref"])
        failed = self.wait_status(job["id"], "FAILED")
        (attempt,) = self.stack.attempts(job["id"])
        assert attempt["failure"] == "oom", attempt
        assert "out of memory" in " ".join(self.diagnostics(job["id"])).lower()
        self.wait_gone(attempt["job_ref"])
        return failed

    def stops(self) -> None:
        job = self.submit("--gpus", "1", "--", "python", "train.py", "--steps", "1000")
        running = self.wait_status(job["id"], "RUNNING")
        assert self.alive(running["job_ref"])
        stopped = self.verb("stop", job["id"])
        assert stopped["status"] == "STOPPED"
        self.wait_gone(running["job_ref"])
        assert self.stack.job(job["id"])["status"] == "STOPPED"
        assert self.stack.attempts(job["id"])[0]["end_reason"].startswith("stopped by")

    def preempts_a_borrower(self, grace_s: float, tick_s: float) -> None:
        """Team demo borrows team lab's idle GPUs; lab submits; demo's job gets its notice,
        checkpoints at the step it is at, goes PAUSED, is queued again, resumes from that
        checkpoint once lab's job is done and finishes with every step run once; lab's job
        starts within the grace plus two ticks; every attempt is billed as run, all of it as
        borrowed. Needs a stack with a short SF_PREEMPT_MIN_RUNTIME_S (a few seconds)."""
        lea_token = self.stack._manage("shell", "-c", LENDER.format(cluster=self.cluster))
        lea_token = lea_token.stdout.strip().splitlines()[-1]
        try:
            self._preempts_a_borrower(lea_token, grace_s, tick_s)
        finally:
            self.stack._manage("shell", "-c", LENDER_GONE)

    def _preempts_a_borrower(self, lea_token: str, grace_s: float, tick_s: float) -> None:
        lab = sf_command(self.workdir, self.home / "lea.json")
        lab("login", "--url", self.stack.url, "--token", lea_token)
        steps = 60
        borrower = self.submit(
            "--gpus", "2", "--", "python", "train.py", "--steps", str(steps),
            "--sleep", "0.25", "--ckpt-every", "20",
        )  # fmt: skip
        job_id = borrower["id"]
        self.wait_status(job_id, "RUNNING")
        read = self.stack.job(job_id)  # the demo user is staff: it may see who lent
        assert (read["borrowed"], read["borrowed_from"]) == (True, "lab")
        wait_until(  # past the minimum runtime, between two periodic checkpoints
            lambda: max(steps_printed(self.logs(job_id)), default=0) >= 23,
            60,
            "step 23",
            self.stack.diagnostics,
        )
        mine = json.loads(
            lab(
                "submit", "--json", "--cluster", self.cluster, "--gpus", "2",
                "--", "python", "train.py", "--steps", "4", "--sleep", "0.1",
            ).stdout
        )  # fmt: skip
        self.submitted.append(mine["id"])
        self.wait(job_id, lambda j: j["status"] == "PAUSED" or j["attempt"] > 1, "preempted")
        why = self.sf("job", "why", str(job_id)).stdout  # PAUSED, QUEUED or resumed: it says so
        assert "Attempt 1 was preempted at" in why, why
        assert "the lending team took back the 2 GPUs" in why, why
        self.wait_status(mine["id"], "SUCCEEDED")
        final = self.wait_status(job_id, "SUCCEEDED", timeout=120)

        (ran,) = _api(self.stack, lea_token, f"/jobs/{mine['id']}/attempts")
        waited = (_ts(ran["start_time"]) - _ts(mine["submitted_at"])).total_seconds()
        bound = grace_s + 2 * tick_s
        print(f"lab's job started {waited:.1f} s after its submission (bound {bound:.0f} s)")
        assert waited <= bound

        lines = self.logs(job_id)
        noticed = [line for line in lines if line.startswith("notice received: checkpointed")]
        assert len(noticed) == 1, lines
        at = int(noticed[0].split()[4].rstrip(","))
        assert f"resuming from step {at}" in lines and lines[-1] == "done", lines
        assert steps_printed(lines) == list(range(1, steps + 1)), lines
        assert final["retry_count"] == 0

        attempts = self.stack.attempts(job_id)
        assert len(attempts) == 2 and attempts[-1]["exit_code"] == 0, attempts
        assert attempts[0]["end_reason"] == "preempted: borrowed GPUs returned to the lending team"
        reasons = [(e["kind"], e["to_status"], e["reason"]) for e in self.events(job_id)]
        paused = "preempted: borrowed GPUs returned to the lending team"
        assert ("status", "PAUSED", paused) in reasons
        assert ("status", "QUEUED", "resuming after preemption; waiting for the scheduler") in (
            reasons
        )
        assert any(
            kind == "note"
            and text.startswith("preemption notice: the lending team needs back the 2 GPUs")
            for kind, _, text in reasons
        )
        # Billed as run, to the second, all of it on borrowed GPUs.
        billed = sum(a["gpu_seconds"] for a in attempts)
        assert billed == pytest.approx(
            sum((_ts(a["end_time"]) - _ts(a["start_time"])).total_seconds() * 2 for a in attempts),
            abs=0.01,
        )
        usage = json.loads(self.sf("usage", "--json").stdout)
        row = next(r for r in usage["rows"] if r["team"] == "demo")  # earlier jobs' too
        assert row["borrowed_gpu_hours"] == pytest.approx(billed / 3600, abs=1e-4)
        assert row["gpu_seconds"] >= billed - 0.01

    def diagnostics(self, job_id: int) -> list[str]:
        return self.stack.api(f"/jobs/{job_id}/diagnostics")["sentences"]

    def no_orphans(self) -> None:
        """Every job this proof submitted is settled and has no live backend object left."""
        for job_id in self.submitted:
            job = self.stack.job(job_id)
            if job["status"] in ACTIVE:
                self.sf("job", "stop", str(job_id), check=False)
        for job_id in self.submitted:
            for attempt in self.stack.attempts(job_id):
                if attempt["job_ref"]:
                    self.wait_gone(attempt["job_ref"], timeout=30)


@contextmanager
def engine_proof(
    tmp_path_factory,
    kind: str,
    settings: dict,
    alive: Callable[[str], bool],
    **stack_env: str,
) -> Iterator[EngineProof]:
    """Start the stack with a `kind` cluster named after it as the demo team's default."""
    stack = Stack(tmp_path_factory.mktemp("var"), **stack_env)
    try:
        stack.start()
        sets = [f"--set={key}={json.dumps(value)}" for key, value in settings.items()]
        stack._manage("cluster", "add", kind, "--kind", kind, *sets, "--default-for", "demo")
        proof = EngineProof(stack, tmp_path_factory.mktemp("client"), kind, alive)
        yield proof
        proof.no_orphans()
    finally:
        stack.close()


def _api(stack: Stack, token: str, path: str):
    request = urllib.request.Request(
        f"{stack.url}/api/v1{path}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def _ts(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value)


@contextmanager
def on_local_stack(tmp_path_factory: pytest.TempPathFactory, **env: str) -> Iterator[EngineProof]:
    """The proof on the real stack with the local executor (`Stack`, with `env` for every
    process), left with no orphaned backend object."""
    stack = Stack(tmp_path_factory.mktemp("var"), **env)
    try:
        stack.start()
        running = EngineProof(stack, tmp_path_factory.mktemp("client"), "local", lambda ref: False)
        yield running
        running.no_orphans()
    finally:
        stack.close()
