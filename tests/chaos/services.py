"""The chaos round's private services: a PostgreSQL database, a Slurm cluster and the stack.

Each is started and stopped by the round (`tests.chaos.driver.run`); the stack's processes can
be SIGKILLed and started again one by one (`ChaosStack.restart`), as the faults do.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.e2e.stack import ROOT, Stack, kill_group

# The server the round's own database is made on: SF_CHAOS_PG, else DATABASE_URL's server.
_LEDGER = os.environ.get("DATABASE_URL", "")
PG_ADMIN = os.environ.get("SF_CHAOS_PG") or (
    _LEDGER.rsplit("/", 1)[0] + "/postgres"
    if _LEDGER.startswith("postgres")
    else "postgres://postgres@127.0.0.1:5432/postgres"
)
SLURM_SCRIPT = ROOT / ".ci" / "slurm.sh"
GPUS = 6  # the local executor's slots and the Slurm node's GPUs: fewer than the quotas add up to


def say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Database:
    """A PostgreSQL database of the driver's own, created and dropped around the run."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(sql)

    def create(self) -> None:
        self.drop()
        self._admin(f'CREATE DATABASE "{self.name}"')

    def drop(self) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


class Slurm:
    """slurmctld + slurmd of the driver's own (state dir and ports), via .ci/slurm.sh."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.port = 7817 + os.getpid() % 500 * 4  # the slurmds take port + 1 to port + 3
        # As many GPUs as the local round's slots: a lender's job waits for its GPUs to come
        # back, not for a cluster too small for the teams' quotas.
        self.env = {
            **os.environ,
            "SF_SLURM_DIR": str(state_dir),
            "SF_SLURM_PORT": str(self.port),
            "SF_SLURM_GPUS": str(GPUS),
            # No accounting: the round compares nothing with sacct, and its MariaDB and
            # slurmdbd would take the ports of the engine suites' Slurm beside it.
            "SF_SLURM_ACCOUNTING": "0",
        }
        self.conf = str(state_dir / "etc" / "slurm.conf")

    def _script(self, action: str, timeout: float = 120) -> str:
        done = subprocess.run(
            [str(SLURM_SCRIPT), action], env=self.env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f".ci/slurm.sh {action} failed:\n{done.stdout}{done.stderr}")
        return done.stdout.strip()

    def up(self) -> None:
        self._script("up")

    def restart_ctld(self) -> None:
        say(self._script("restart-ctld").replace("\n", "; "))

    def resume_unusable_nodes(self) -> bool:
        """Resume a node left drained or down (after a slurmctld crash Slurm may reuse job ids
        that slurmd still runs and drain the node: "Duplicate jobid"), as an operator would."""
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"],
            env={**self.env, "SLURM_CONF": self.conf}, capture_output=True, text=True, timeout=30,
        ).stdout  # fmt: skip
        bad = [n for n, st in (line.split()[:2] for line in out.splitlines() if " " in line)
               if st.startswith(("drain", "down"))]  # fmt: skip
        for node in bad:
            say(f"resuming slurm node {node}: {self.nodes()}")
            subprocess.run(
                ["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                env={**self.env, "SLURM_CONF": self.conf}, check=False, timeout=30,
            )  # fmt: skip
        return bool(bad)

    def nodes(self) -> str:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-O", "NodeHost:|,StateLong:|,Gres:|,GresUsed:|,Reason:40"],
            env={**self.env, "SLURM_CONF": self.conf}, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return (done.stdout + done.stderr).strip()

    def explain(self, work_dir: Path, attempts: list[tuple[str, str]]) -> str:
        """What Slurm and the attempt dirs say about (backend name, job id) pairs, for a
        job that did not end: scontrol's view, the runner's files and the daemons' log lines."""
        env = {**self.env, "SLURM_CONF": self.conf}
        lines = []
        for name, ref in attempts:
            shown = subprocess.run(
                ["scontrol", "-o", "show", "job", ref], env=env, capture_output=True, text=True,
                timeout=30,
            )  # fmt: skip
            lines.append(f"  {name} slurm job {ref}: {(shown.stdout + shown.stderr).strip()}")
            attempt_dir = work_dir / name
            for f in sorted(attempt_dir.glob("*")) if attempt_dir.is_dir() else []:
                if f.is_file() and f.stat().st_size < 4000:
                    lines.append(f"    {f.name}: {f.read_text(errors='replace').strip()[:600]}")
            for log in ("slurmctld.log", "slurmd.log"):
                path = self.dir / "log" / log
                if ref and path.exists():
                    hits = [ln for ln in path.read_text(errors="replace").splitlines()
                            if f"JobId={ref} " in ln or f"JobId={ref}." in ln
                            or ln.endswith(f"JobId={ref}") or f"job {ref} " in ln
                            or f"[{ref}]" in ln or f"[{ref}." in ln]  # fmt: skip
                    lines += [f"    {log}: {ln}" for ln in hits[-15:]]
        return "\n".join(lines)

    def down(self) -> None:
        with contextlib.suppress(Exception):  # every job on this private cluster is ours
            subprocess.run(
                ["scancel", "--user", str(os.getuid())],
                env={**self.env, "SLURM_CONF": self.conf}, check=False, timeout=30,
            )  # fmt: skip
        self._script("down")
        shutil.rmtree(self.dir, ignore_errors=True)


# -- the stack, with restartable processes -----------------------------------------------------


class ChaosStack(Stack):
    """`Stack` on a PostgreSQL ledger and a private Redis, able to kill and restart any process."""

    def __init__(self, var: Path, database_url: str, redis_url: str) -> None:
        # Workers are killed every few seconds: a launch one died in is taken over after 15 s,
        # not production's two minutes, so the round settles within its time.
        # Preemption of borrowed GPUs after 2 s of running, not 10 min, so a round sees some.
        super().__init__(
            var,
            REDIS_URL=redis_url,
            SF_LOCAL_GPU_SLOTS=str(GPUS),
            SF_LAUNCH_CLAIM_S="15",
            SF_PREEMPT_MIN_RUNTIME_S="2",
            SF_PREEMPT_GRACE_S="20",
        )
        self.env["DATABASE_URL"] = database_url
        self.argv: dict[str, tuple[str, ...]] = {}
        self.died: dict[str, list[int]] = {}  # exit codes of processes that ended on their own

    def _spawn(self, name: str, *args: str) -> None:
        self.argv[name] = args
        super()._spawn(name, *args)

    def restart(self, name: str, down_s: float = 1.0) -> None:
        """SIGKILL the process group `name`, wait `down_s`, start it again."""
        proc = self.procs.pop(name, None)
        if proc is not None:
            kill_group(proc, signal.SIGKILL)
        time.sleep(down_s)
        self._spawn(name, *self.argv[name])

    def revive(self) -> None:
        """Start again, as a supervisor would, any process that ended without being killed,
        and note its exit code: no fault should end one by itself (a worker that exits when
        Redis goes away stalls every loop)."""
        for name, proc in list(self.procs.items()):
            if proc.poll() is not None:
                self.died.setdefault(name, []).append(proc.returncode)
                say(f"{name} ended on its own (exit {proc.returncode}); starting it again")
                self.restart(name, down_s=0)

    def start_second_beat(self) -> None:
        self._spawn(
            "beat2",
            *("-m", "celery", "-A", "starforge", "beat", "--loglevel", "INFO"),
            *("--schedule", str(self.var / "beat2")),
        )

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            kill_group(proc, signal.SIGKILL)

    def call(self, method: str, path: str, body: dict | None = None, tries: int = 60) -> Any:
        """An API call that waits out a restarting server (connection refused, 502-ish)."""
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(tries):
            request = urllib.request.Request(
                f"{self.url}/api/v1{path}",
                data=data,
                method=method,
                headers={
                    "Authorization": f"Bearer {self.token}",
                    "Content-Type": "application/json",
                },
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    raw = answer.read()
                    return json.loads(raw) if raw else None
            except urllib.error.HTTPError as exc:
                if exc.code < 500:
                    raise
            except OSError:
                pass
            time.sleep(min(0.5 * (attempt + 1), 2))
        raise AssertionError(f"{method} {path}: the API did not answer")

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if check:
            assert done.returncode == 0, f"manage.py {args}: {done.stdout}\n{done.stderr}"
        return done
