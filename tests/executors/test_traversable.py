"""The way through for local jobs under other uids (`jobs.traversable`; issue 47, point 13).

A fresh clone's check, on a small scale: Python installed under a 0700 home (pyenv under root's
home, as on the machines this is built on). A job's uid cannot start it; once `make run`'s
opener has been through, it can, and it still cannot list the home. The whole README first job
on such a machine is tests/e2e/test_first_job_as_root.py.
"""

import os
import stat
from pathlib import Path

import pytest

from jobs.traversable import interpreter_paths, open_for_local_jobs, open_the_way
from tests.access import as_job, let_jobs_through, python_in_a_closed_home

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs processes as another uid")


@pytest.fixture
def home(tmp_path) -> Path:
    let_jobs_through(tmp_path)
    return tmp_path / "root-home"


@pytest.fixture
def python(home) -> Path:
    return python_in_a_closed_home(home)


def test_a_job_reaches_an_interpreter_under_a_closed_home_once_the_way_is_open(home, python):
    with pytest.raises(PermissionError):
        as_job(str(python), "-c", "pass")  # the job's uid cannot even start it
    opened = open_the_way(interpreter_paths(str(python)))
    assert opened == [home]
    assert stat.S_IMODE(home.stat().st_mode) == 0o701  # passable, never readable
    ran = as_job(str(python), "-c", "import json, sf.contract; print('ran')")
    assert (ran.returncode, ran.stdout) == (0, "ran\n"), ran.stderr
    listed = as_job(str(python), "-c", f"import os; os.listdir({str(home)!r})")
    assert listed.returncode != 0 and "PermissionError" in listed.stderr


def test_opening_adds_only_passage_and_only_where_it_is_missing(tmp_path):
    let_jobs_through(tmp_path)
    closed, readable, group_only = tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"
    group_only.mkdir(parents=True)
    closed.chmod(0o700)
    readable.chmod(0o755)
    group_only.chmod(0o750)
    target = group_only / "file"
    target.write_text("")
    target.chmod(0o600)
    assert open_the_way([target]) == [closed, group_only]
    assert [stat.S_IMODE(p.stat().st_mode) for p in (closed, readable, group_only, target)] == [
        0o701,
        0o755,
        0o751,
        0o600,
    ]
    assert open_the_way([target]) == []  # nothing left to open


def test_make_run_opens_the_way_for_a_cluster_that_runs_jobs_as_other_uids(
    settings, local_cluster, home, python, tmp_path
):
    settings.SF_RUNNER_PYTHON = str(python)
    assert home in open_for_local_jobs()
    assert stat.S_IMODE(home.stat().st_mode) == 0o701


def test_nothing_is_opened_for_jobs_that_run_as_the_servers_own_user(
    settings, local_cluster, home, python
):
    local_cluster.settings = {"run_as": "none"}
    local_cluster.save()
    settings.SF_RUNNER_PYTHON = str(python)
    assert open_for_local_jobs() == []
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
