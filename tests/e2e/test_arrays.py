"""A job array end to end on the real stack (web server, Celery worker and beat, the local
executor): `sf submit --array 0-5 --max-parallel 2` runs six tasks to SUCCEEDED, never more
than two at once, each seeing its own index and its filled-in command; `sf job list` shows the
array as one row."""

import json
import time
from collections.abc import Iterator

import pytest

from tests.engines.proof import EngineProof, on_local_stack

pytestmark = pytest.mark.e2e
TASK = (
    "import os, sys, time; print('task', os.environ['SF_ARRAY_INDEX'], sys.argv[1]); time.sleep(2)"
)


@pytest.fixture(scope="module")
def proof(tmp_path_factory) -> Iterator[EngineProof]:
    with on_local_stack(tmp_path_factory) as running:
        yield running


def test_an_array_runs_every_task_at_most_max_parallel_at_once(proof):
    made = json.loads(
        proof.sf(
            "submit", "--json", "--cluster", "local", "--gpus", "1", "--array", "0-5",
            "--max-parallel", "2", "--", "python", "-c", TASK, "seed-{index}",
        ).stdout
    )  # fmt: skip
    array = made["id"]
    most, deadline = 0, time.monotonic() + 90
    while time.monotonic() < deadline:
        shown = proof.stack.api(f"/arrays/{array}")
        active = sum(
            n for s, n in shown["counts"].items() if s in ("SUBMITTED", "PENDING", "RUNNING")
        )
        most = max(most, active)
        if shown["counts"] == {"SUCCEEDED": 6}:
            break
        time.sleep(0.3)
    assert shown["counts"] == {"SUCCEEDED": 6}, [t["reason"] for t in shown["tasks"]]
    assert most == 2  # the cap was reached and never passed
    for task in shown["tasks"]:
        lines = proof.logs(task["id"])
        assert f"task {task['index']} seed-{task['index']}" in lines, lines
    listed = proof.sf("job", "list").stdout
    assert f"a{array}" in listed and "6 SUCCEEDED" in listed
