"""`manage.py runstack` serves HTTP from granian's workers and the live pages' websockets from
the ASGI server on a port of its own, which takes handshakes from the console's pages only; the
web server alone (`starforge.serving`) keeps the server's environment out of requests and
takes its workers down with it."""

import asyncio
import contextlib
import http.cookiejar
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import websockets

from starforge.serving import web_server_argv
from tests.e2e.stack import (
    ROOT,
    free_port,
    kill_group,
    sf_command,
    spawn_logged,
    stack_env,
    wait_until,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    var = tmp_path_factory.mktemp("var")
    port, ws_port = free_port(), free_port()
    with open(var / "stack.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "runstack", "--workers", "2"],
            cwd=ROOT,
            env=stack_env(var, port, ws_port),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        banner = wait_until(
            lambda: re.search(r"--token (\S+)", (var / "stack.log").read_text()),
            90,
            "the runstack banner",
            lambda: (var / "stack.log").read_text()[-3000:],
        )
        yield {
            "proc": proc,
            "url": f"http://127.0.0.1:{port}",
            "port": port,
            "ws_port": ws_port,
            "token": banner.group(1),
            "password": (var / "demo-password").read_text().strip(),
            "var": var,
        }
    finally:
        kill_group(proc, signal.SIGTERM, wait=20)


def listening(port: int) -> psutil.Process:
    """A process holding the listening socket of `port` (psutil names one of those sharing it)."""
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid)
    raise AssertionError(f"nothing listens on port {port}")


def granian(process: psutil.Process | None) -> bool:
    return process is not None and "granian" in " ".join(process.cmdline())


@contextlib.contextmanager
def web_server(stack, tmp_path: Path, **env: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """The web server alone (as `starforge.serving` spells it, two workers) on the stack's
    ledger, with `env` added to its environment; its process and URL."""
    port = free_port()
    argv = web_server_argv("127.0.0.1", port, 2)[1:]
    proc = spawn_logged(tmp_path / "web.log", stack_env(stack["var"], port, **env), *argv)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: answers(f"{url}/api/v1/me", {}) is not None,
            60,
            "the web server",
            lambda: (tmp_path / "web.log").read_text()[-3000:],
        )
        yield proc, url
    finally:
        kill_group(proc)


def answers(url: str, headers: dict[str, str]) -> int | None:
    """The HTTP status `url` answers with; None when nothing answers."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as a:
            return a.status
    except urllib.error.HTTPError as refused:
        return refused.code
    except OSError:
        return None


def signed_in(stack) -> http.cookiejar.CookieJar:
    """A console session of the demo user, signed in through the login form."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    form = opener.open(f"{stack['url']}/accounts/login/", timeout=30).read().decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    body = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": csrf, "username": "demo", "password": stack["password"]}
    ).encode()
    request = urllib.request.Request(
        f"{stack['url']}/accounts/login/", data=body, headers={"Referer": stack["url"]}
    )
    opener.open(request, timeout=30).read()
    assert any(c.name == "sessionid" for c in jar), "the demo user could not sign in"
    return jar


def cookie_header(jar: http.cookiejar.CookieJar) -> str:
    return "; ".join(f"{c.name}={c.value}" for c in jar)


async def first_line(url: str, origin: str, cookie: str, timeout: float) -> str:
    """The text of the first log line the job's stream pushes."""
    async with websockets.connect(
        url, origin=origin, additional_headers={"Cookie": cookie}, open_timeout=10
    ) as ws:
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(
                await asyncio.wait_for(ws.recv(), max(0.1, deadline - time.monotonic()))
            )
            if message.get("type") == "job.lines" and message.get("lines"):
                return message["lines"][0]["text"]


def handshake_refused(url: str, origin: str, cookie: str) -> bool:
    async def attempt() -> bool:
        try:
            async with websockets.connect(
                url, origin=origin, additional_headers={"Cookie": cookie}, open_timeout=10
            ):
                return False
        except websockets.InvalidStatus as refused:
            return refused.response.status_code == 403

    return asyncio.run(attempt())


def test_http_is_served_by_granian_workers(stack):
    web = listening(stack["port"])
    assert granian(web)
    master = web.parent() if granian(web.parent()) else web
    assert len([p for p in master.children() if granian(p)]) == 2  # --workers 2
    request = urllib.request.Request(
        f"{stack['url']}/api/v1/me", headers={"Authorization": f"Bearer {stack['token']}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert json.loads(answer.read())["username"] == "demo"
    assert "uvicorn" in " ".join(listening(stack["ws_port"]).cmdline())


def test_a_request_carries_nothing_of_the_servers_environment(stack, tmp_path):
    """granian starts each request's environ from the process environment: a server variable
    named like a header would read as one the client sent. Here the server's environment holds
    a token of the demo user as HTTP_AUTHORIZATION; a request without that header stays
    anonymous, one with its own token is the demo user."""
    issue = "from jobs.actions.tokens import issue_token; "
    issue += "from django.contrib.auth.models import User; "
    issue += "print(issue_token(User.objects.get(username='demo'), name='in-the-environment'))"
    shell = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", issue],
        cwd=ROOT,
        env=stack_env(stack["var"], free_port()),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    server_token = shell.stdout.strip().splitlines()[-1]
    me = "/api/v1/me"
    with web_server(stack, tmp_path, HTTP_AUTHORIZATION=f"Bearer {server_token}") as (_, url):
        assert answers(url + me, {}) == 401
        assert answers(url + me, {"Authorization": f"Bearer {stack['token']}"}) == 200


@pytest.mark.parametrize("killed", ["while its workers load", "while they serve"])
def test_the_web_servers_workers_stop_when_it_is_killed(stack, tmp_path, killed):
    """A web server SIGKILLed (the OOM killer, a crash) leaves no worker serving its port
    unsupervised: not those serving, nor those still loading Django when it died, which once
    took whatever adopted them for their server."""
    port = free_port()
    argv = web_server_argv("127.0.0.1", port, 2)[1:]
    proc = spawn_logged(tmp_path / "web.log", stack_env(stack["var"], port), *argv)
    url = f"http://127.0.0.1:{port}"
    try:
        workers = wait_until(lambda: _two_children(proc.pid), 30, "the server's two workers")
        if killed == "while they serve":
            wait_until(lambda: answers(url + "/api/v1/me", {}) == 401, 60, "the server")
        os.kill(proc.pid, signal.SIGKILL)  # the server alone, not its process group
        proc.wait(timeout=10)
        wait_until(
            lambda: not any(_running(w) for w in workers),
            30,
            "the killed server's workers to stop",
            lambda: (tmp_path / "web.log").read_text()[-3000:],
        )
        assert answers(url + "/api/v1/me", {}) is None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the workers too, should the test fail
        kill_group(proc)


def _two_children(pid: int) -> list[psutil.Process] | None:
    children = psutil.Process(pid).children()
    return children if len(children) == 2 else None


def _running(process: psutil.Process) -> bool:
    """Alive and not a zombie (an orphan killed waits for init to reap it)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_embedded_ledger_lets_several_workers_read_while_one_writes(stack):
    with sqlite3.connect(stack["var"] / "starforge.sqlite3") as ledger:
        assert ledger.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_live_page_streams_a_log_line_over_the_websocket_server(stack, tmp_path):
    jar = signed_in(stack)
    sf = sf_command(tmp_path, tmp_path / "sf.json")
    sf("login", "--url", stack["url"], "--token", stack["token"])
    code = "import time\nfor i in range(120):\n    print(f'live {i}', flush=True); time.sleep(0.5)"
    (tmp_path / "live.py").write_text(code)
    job = json.loads(sf("submit", "--gpus", "0", "--json", "--", "python", "live.py").stdout)
    try:
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        page = opener.open(f"{stack['url']}/jobs/{job['id']}/", timeout=30).read().decode()
        assert f'<meta name="sf-websocket-port" content="{stack["ws_port"]}">' in page
        url = f"ws://127.0.0.1:{stack['ws_port']}/ws/jobs/{job['id']}/"
        line = asyncio.run(first_line(url, stack["url"], cookie_header(jar), timeout=60))
        assert line.startswith("live ")
    finally:
        sf("job", "stop", str(job["id"]), check=False)


def test_a_websocket_from_any_origin_but_the_consoles_is_refused(stack):
    jar = signed_in(stack)
    url = f"ws://127.0.0.1:{stack['ws_port']}/ws/jobs/"
    cookie = cookie_header(jar)
    assert not handshake_refused(url, stack["url"], cookie)
    for origin in (
        "http://evil.example",
        f"http://127.0.0.1:{stack['ws_port']}",  # the websocket server serves no pages
        f"https://127.0.0.1:{stack['port']}",
        f"http://localhost:{stack['port']}",  # another name than the handshake's Host
    ):
        assert handshake_refused(url, origin, cookie), origin


def test_log_followers_do_not_hold_the_web_workers(stack, tmp_path):
    """Four `sf job logs` follows against two web workers: each is answered at once with
    when to ask again, so a job read still gets a worker (held for their 20 s wait, the four
    would have taken both workers and the read would wait behind them)."""
    sf = sf_command(tmp_path, tmp_path / "sf.json")
    sf("login", "--url", stack["url"], "--token", stack["token"])
    job = json.loads(sf("submit", "--gpus", "0", "--json", "--", "sleep", "60").stdout)
    auth = {"Authorization": f"Bearer {stack['token']}"}
    follow = f"{stack['url']}/api/v1/jobs/{job['id']}/logs?follow=true&wait=20&poll=true"

    def get(url: str) -> dict:
        request = urllib.request.Request(url, headers=auth)
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    try:
        started = time.monotonic()
        with ThreadPoolExecutor(5) as pool:
            follows = [pool.submit(get, follow) for _ in range(4)]
            time.sleep(0.2)
            read = get(f"{stack['url']}/api/v1/jobs/{job['id']}")
            read_s = time.monotonic() - started
            answers = [f.result() for f in follows]
        assert read["id"] == job["id"] and read_s < 5, read_s
        assert time.monotonic() - started < 10
        assert all(a["poll_after_s"] > 0 and not a["done"] for a in answers if not a["lines"])
    finally:
        sf("job", "stop", str(job["id"]), check=False)
