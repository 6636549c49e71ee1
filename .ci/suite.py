"""`make test`: the whole suite as five pytest runs, three at a time, each slot with its own Redis.

Run one after another the suite takes some 40 minutes here, and one run at a time leaves the
machine idle for most of it: a pytest process uses one core at most, and the tests that bring
up whole stacks, Slurm or the chaos driver mostly wait (on a visibility timeout, a disconnect,
processes restarting). A CI run with two slots used 0.7 of its 2 cores on average. So the
suite is cut where nothing is shared between the parts, and three run at once, the longest
first except Slurm's, which starts when the stacks end so that its chaos rounds (last in it)
meet less load:
- "rest": the layers' tests on PostgreSQL, everything not in another run;
- "slurm": the Slurm engine's tests and the chaos rounds (one Slurm on the host: these run in
  one process, one after another);
- "e2e": the whole stacks (a real Celery worker, the web and websocket servers);
- "stacks": the browser (Chromium), the Ray and Kubernetes engines' and the identity tests
  (one Ray on the host: its tests are all here);
- "sqlite": the ledger suite on the embedded SQLite default.

Each run has its own PostgreSQL test database (pytest-django's `test_` + the URL's name +
`_` + the run's name) and its own pytest base temp dir; each slot has its own Redis server
(the embedded one `make run` uses, on a free port), so the Redis database numbers tests pick
for themselves stay theirs. Output comes line by line, each line led by its run's name. The
exit status is the first failing run's; a run that collected no tests (pytest's 5) is a
failure, and after a failure no further run starts.

    .venv/bin/python .ci/suite.py              # every run
    .venv/bin/python .ci/suite.py e2e sqlite   # some of them
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.stack import Redis  # noqa: E402 - a private redis-server on a free port

PG = os.environ.get("PG_URL", "postgres://postgres@127.0.0.1:5432/starforge_ci")
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
SLOTS = 3  # runs at once: see above (the machines this runs on have 2 cores)

# The runs besides "rest", each a set of folders (see the module's docstring).
SLURM = ["tests/engines/slurm", "tests/chaos"]  # the chaos rounds last: see RUNS
E2E = ["tests/e2e"]
STACKS = ["tests/browser", "tests/engines/ray", "tests/engines/kubernetes", "tests/identity"]
# The ledger suite: the tests of the server's layers and of metering, which run on either
# database (the Makefile's test-sqlite names the same folders). Not the real S3 server's.
LEDGER = [
    f"tests/{folder}"
    for folder in "ledger loops actions reads api console stores executors metering audit".split()
]
DURATIONS = "--durations=10"


@dataclass(frozen=True)
class Run:
    name: str
    title: str
    args: list[str]
    sqlite: bool = False  # the embedded default's ledger (a file of the run's own), else PG


RUNS = [  # the longest first, but Slurm's after the stacks: its chaos rounds (last in it) time
    # a lender's reclaim against a borrower's run, and beside three other runs they missed it
    Run(
        "rest",
        "the layers on PostgreSQL",
        ["tests", *(f"--ignore={path}" for path in (*SLURM, *E2E, *STACKS)), DURATIONS],
    ),
    Run("e2e", "whole stacks on PostgreSQL", [*E2E, DURATIONS]),
    Run("stacks", "browser, Ray, Kubernetes and identity on PostgreSQL", [*STACKS, DURATIONS]),
    Run("slurm", "Slurm and the chaos rounds on PostgreSQL", [*SLURM, DURATIONS]),
    Run(
        "sqlite",
        "the ledger suite on the embedded SQLite default",
        ["-m", "not postgres and not e2e and not s3", *LEDGER],
        sqlite=True,
    ),
]


class Slot(threading.Thread):
    """Takes runs off the queue until it is empty or a run has failed, echoing their output."""

    def __init__(self, runs: queue.Queue, scratch: Path, suite: Suite) -> None:
        super().__init__()
        self.runs, self.scratch, self.suite = runs, scratch, suite
        self.child: subprocess.Popen | None = None

    def run(self) -> None:
        redis = Redis()
        redis.start()
        try:
            while not self.suite.failed():
                try:
                    run = self.runs.get_nowait()
                except queue.Empty:
                    return
                self.suite.ended(run, self.pytest(run, redis.port))
        finally:
            redis.kill()

    def pytest(self, run: Run, port: int) -> int:
        env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{port}/11"}
        if run.sqlite:
            env["DATABASE_URL"] = ""
            env["SF_SQLITE_TEST_DB"] = str(self.scratch / f"{run.name}.sqlite3")
        else:
            url = urlsplit(PG)  # the run's own database: the URL's name + _ + the run's
            env["DATABASE_URL"] = urlunsplit(url._replace(path=f"{url.path}_{run.name}"))
        basetemp = self.scratch / run.name
        self.suite.say(run, f"== {run.title}: pytest {' '.join(run.args)}")
        started = time.monotonic()
        self.child = subprocess.Popen(
            [*PYTEST, f"--basetemp={basetemp}", *run.args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        assert self.child.stdout is not None
        for line in self.child.stdout:
            self.suite.say(run, line.rstrip("\n"))
        rc = self.child.wait()
        self.suite.say(run, f"== {run.title}: exit {rc} after {time.monotonic() - started:.0f} s")
        if rc == 5:
            self.suite.say(run, "no tests ran: a suite that ran nothing is a failure")
        return rc


class Suite:
    """What the slots share: the terminal and each run's exit status."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rcs: dict[str, int] = {}

    def say(self, run: Run, line: str) -> None:
        with self.lock:
            print(f"[{run.name}] {line}", flush=True)

    def ended(self, run: Run, rc: int) -> None:
        with self.lock:
            self.rcs[run.name] = rc

    def failed(self) -> bool:
        with self.lock:
            return any(rc != 0 for rc in self.rcs.values())


def main(names: list[str]) -> int:
    chosen = [run for run in RUNS if not names or run.name in names]
    if not chosen or len(chosen) < len(set(names)):
        known = ", ".join(run.name for run in RUNS)
        print(f"unknown run in {' '.join(names)}; the runs are {known}", file=sys.stderr)
        return 2
    runs: queue.Queue = queue.Queue()
    for run in chosen:
        runs.put(run)
    suite = Suite()
    with tempfile.TemporaryDirectory(prefix="sf-suite-") as scratch:
        os.chmod(scratch, 0o755)  # jobs run under their team's uid reach their tmp dirs
        slots = [Slot(runs, Path(scratch), suite) for _ in range(min(SLOTS, len(chosen)))]
        for slot in slots:
            slot.start()
        try:
            for slot in slots:
                slot.join()
        except KeyboardInterrupt:  # the children, in our process group, had the SIGINT too
            for slot in slots:
                if slot.child is not None and slot.child.poll() is None:
                    slot.child.send_signal(signal.SIGINT)
            for slot in slots:
                slot.join()
            return 130
    for run in chosen:
        rc = suite.rcs.get(run.name)
        print(f"{run.name}: {'not run' if rc is None else 'passed' if rc == 0 else f'exit {rc}'}")
    if len(suite.rcs) < len(chosen) and not suite.failed():
        return 1  # a slot died (its traceback is above: its Redis did not start...) and left runs
    failed = [rc for rc in suite.rcs.values() if rc != 0]
    return (failed[0] or 1) if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
