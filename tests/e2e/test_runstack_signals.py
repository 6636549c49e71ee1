"""`manage.py runstack` stops every process it started on SIGINT and SIGTERM, whatever signal
dispositions it inherited (issue 47, point 14). A shell starts a script's background job with
SIGINT ignored; Python then installs no KeyboardInterrupt handler, and runstack ignored Ctrl-C
while the whole stack ran on. Here it is started with both signals ignored, as `trap "" INT
TERM` leaves them, and its REDIS_URL (the suite's, without a password) is used as given, with a
warning."""

import signal
import subprocess
import sys

import psutil
import pytest

from tests.e2e.stack import ROOT, free_port, kill_group, stack_env, wait_until

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_stops_every_process_even_when_runstack_started_with_it_ignored(
    tmp_path, stop
):
    env = stack_env(tmp_path, free_port())
    log = tmp_path / "stack.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["sh", "-c", 'trap "" INT TERM; exec "$0" manage.py runstack', sys.executable],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: "sf login --url" in log.read_text(), 120, "the banner", log.read_text)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 4  # granian (+ workers), uvicorn, celery worker (+ pool), beat
        proc.send_signal(stop)  # to runstack alone, as `kill` from a script would
        assert proc.wait(timeout=45) == 0, log.read_text()[-3000:]
        _, alive = psutil.wait_procs(children, timeout=20)
        assert alive == [], [p.cmdline() for p in alive]
        assert f"{stop.name}: stopping every process started here" in log.read_text()
        assert "has no password: any process that reaches it" in log.read_text()
    finally:
        kill_group(proc)  # whatever happened above, nothing of this stack stays behind
