"""The README's first job, as root, on a machine like a fresh clone's (issue 47, points 2, 11, 12
and 13): `make run` with no REDIS_URL, its interpreter and the checkout's SF_VAR_DIR under a home
directory at 0700 (pyenv under root's home). It succeeds, isolation kept: the home is opened
for passage only, runstack says so, its Redis asks for a password, what it wrote is private
but for the folders jobs pass through, and a missing page shows no debug page."""

import contextlib
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

from tests.access import as_job, python_in_a_closed_home
from tests.e2e.stack import ROOT, free_port, kill_group, sf_command, stack_env, wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="runs jobs as other uids: needs root"),
]
# Where a job under another uid passes through (`jobs.executors.local`): traversable only.
PASSED_THROUGH = {"", "local-executor", "local-executor/local", "runs"}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Iterator[dict]:
    home = tmp_path_factory.mktemp("fresh") / "root-home"
    python = python_in_a_closed_home(home)  # 0700 from here on
    var = home / "starforge" / "var"
    port, redis_port = free_port(), free_port()
    env = stack_env(var, port, SF_RUNNER_PYTHON=str(python), SF_REDIS_PORT=str(redis_port))
    env.pop("REDIS_URL")  # as a fresh clone's `make run`: the embedded Redis
    env.pop("SF_DEBUG", None)
    log = home.parent / "stack.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "runstack"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        token = wait_until(
            lambda: re.search(r"--token (\S+)", log.read_text()),
            120,
            "the runstack banner",
            lambda: log.read_text()[-3000:],
        ).group(1)
        yield {
            "home": home,
            "var": var,
            "url": f"http://127.0.0.1:{port}",
            "token": token,
            "redis_port": redis_port,
            "output": log.read_text(),
        }
    finally:
        kill_group(proc, signal.SIGINT)


def test_the_readmes_first_job_succeeds(fresh, tmp_path):
    workdir = tmp_path / "examples"
    shutil.copytree(ROOT / "examples", workdir)
    sf = sf_command(workdir, tmp_path / "sf.json")
    sf("login", "--url", fresh["url"], "--token", fresh["token"])
    sf("submit", "--gpus", "1", "--", "python", "train.py", "--steps", "3", "--sleep", "0.01")
    logs = sf("job", "logs", timeout=180).stdout.splitlines()
    status = sf("job", "status", "--json").stdout
    assert logs[-1] == "done", (logs, status, _tail(fresh))
    assert '"status": "SUCCEEDED"' in status


def test_runstack_says_what_it_opened_and_opens_it_for_passage_only(fresh):
    home = fresh["home"]
    opened = next(line for line in fresh["output"].splitlines() if " opened " in line)
    assert f" {home}, " in opened and "for them to pass through (o+x" in opened
    assert stat.S_IMODE(home.stat().st_mode) == 0o701
    listed = as_job(sys.executable, "-c", f"import os; os.listdir({str(home)!r})")
    assert listed.returncode != 0


def test_its_redis_asks_for_this_installations_password(fresh):
    assert f"an embedded one on 127.0.0.1:{fresh['redis_port']}, asking for" in fresh["output"]
    stranger = redis.Redis(host="127.0.0.1", port=fresh["redis_port"], protocol=2)
    with pytest.raises(redis.AuthenticationError):
        stranger.ping()
    password = (fresh["var"] / "redis-password").read_text().strip()
    assert redis.Redis(host="127.0.0.1", port=fresh["redis_port"], password=password).ping()


def test_what_it_wrote_is_private_but_the_folders_jobs_pass_through(fresh):
    var = fresh["var"]
    open_to_others = {}
    for path in [var, *var.glob("*"), *var.glob("local-executor/*"), *var.glob("logs/**/*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077:
            relative = path.relative_to(var).as_posix()
            open_to_others["" if relative == "." else relative] = mode
    assert set(open_to_others) <= PASSED_THROUGH, open_to_others
    assert all(mode & 0o066 == 0 for mode in open_to_others.values()), open_to_others


def test_a_missing_page_is_not_djangos_debug_page(fresh):
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{fresh['url']}/no-such-page/", timeout=30)
    assert missing.value.code == 404
    assert b"URLconf" not in missing.value.read()


def _tail(fresh: dict) -> str:
    with contextlib.suppress(OSError):
        return (fresh["home"].parent / "stack.log").read_text()[-4000:]
    return ""
