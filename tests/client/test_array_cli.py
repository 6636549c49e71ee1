"""`sf submit --array/--array-file`, `sf job list` folding an array into one row, `sf job
status aN` and the verbs on `aN`, against the real server (live_server)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from jobs.ledger.transitions import transition
from jobs.models import Job, JobArray
from jobs.states import JobStatus as S

pytestmark = pytest.mark.django_db(transaction=True)
Sf = Callable[..., tuple[int, str, str]]


@pytest.fixture(autouse=True)
def project(tmp_path, monkeypatch) -> None:
    """A small project directory to submit from."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)


def test_an_array_submits_lists_as_one_row_and_its_tasks_act_together(sf):
    code, out, err = sf(
        "submit", "--array", "0-5", "--max-parallel", "2", "--name", "sweep",
        "--", "python", "train.py", "--seed", "{index}",
    )  # fmt: skip
    assert code == 0, err
    array = JobArray.objects.get()
    assert out.splitlines()[0] == (
        f"submitted array a{array.pk}: 6 tasks, at most 2 at once (6 QUEUED)"
    )
    seeds = sorted(int(j.entrypoint[-1]) for j in Job.objects.filter(array=array))
    assert seeds == [0, 1, 2, 3, 4, 5]
    _, single, _ = sf("submit", "--", "python", "train.py")
    code, out, _ = sf("job", "list")
    rows = [line.split()[0] for line in out.splitlines()[1:]]
    assert rows == [single.split()[2], f"a{array.pk}"]  # newest first, the array one row
    assert "6 QUEUED" in out and "array of 6 tasks, at most 2 at once" in out
    code, out, _ = sf("job", "list", "--tasks")
    assert len(out.splitlines()) == 1 + 7
    failed = Job.objects.get(array=array, array_index=4)
    for status in (S.SUBMITTED, S.PENDING, S.RUNNING, S.FAILED):
        transition(failed.pk, status, actor="test")
    code, out, _ = sf("job", "stop", f"a{array.pk}")
    assert code == 0
    assert out.strip() == (
        f"array a{array.pk} stop: 5 task(s) moved, 1 left as they were; now 1 FAILED, 5 STOPPED"
    )
    code, out, _ = sf("job", "retry", f"a{array.pk}", "--failed")
    assert "1 task(s) moved, 5 left" in out and "1 QUEUED" in out
    code, out, _ = sf("job", "status", f"a{array.pk}")
    assert f"array:          a{array.pk}" in out and "max parallel:   2" in out
    assert "  [4] job" in out and "QUEUED" in out
    code, out, _ = sf("job", "status", f"a{array.pk}", "--json")
    assert json.loads(out)["counts"] == {"QUEUED": 1, "STOPPED": 5}


def test_an_array_file_gives_each_task_its_line(sf, tmp_path):
    (tmp_path / "params.jsonl").write_text('{"lr": 0.1}\n\n{"lr": 0.01}\n')
    code, out, err = sf(
        "submit", "--array-file", "params.jsonl", "--", "python", "train.py", "--lr", "{lr}"
    )
    assert code == 0, err
    assert sorted(j.entrypoint[-1] for j in Job.objects.all()) == ["0.01", "0.1"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--array", "5-1"], "error: --array '5-1': the range 5-1 ends before it starts"),
        (["--array", "0-100000000"], "indices go up to"),
        (["--array-file", "bad.jsonl"], "--array-file bad.jsonl, line 2: not JSON"),
        (["--array-file", "list.jsonl"], "--array-file list.jsonl, line 1: not a JSON object"),
        (["--array", "0-3", "--array-file", "bad.jsonl"], "not both"),
        (["--max-parallel", "2"], "--max-parallel goes with --array or --array-file"),
    ],
)
def test_bad_arrays_are_refused_with_a_sentence_and_nothing_made(sf, tmp_path, args, words):
    (tmp_path / "bad.jsonl").write_text('{"lr": 0.1}\n{"lr": \n')
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    code, _, err = sf("submit", *args, "--", "python", "train.py")
    assert code in (1, 2) and words in err, err
    assert not Job.objects.exists() and not JobArray.objects.exists()


def test_failed_goes_with_an_array_id_only(sf):
    code, _, err = sf("job", "retry", "12", "--failed")
    assert code == 2 and "--failed goes with an array id" in err
