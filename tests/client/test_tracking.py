"""The job's way to the MLflow tracking endpoint (`sf.tracking`): which variables a job gets, and
the forwarder a sandboxed job reaches it through, against a stand-in server: only tracking
requests pass, answered in MLflow's error shape otherwise, bounded, and a close never waits."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from sf import environment, tracking
from sf.contract import TRACKING_TOKEN_VAR, TRACKING_URI_VAR, USER_ENV_VAR, tracking_token
from sf.environment import RunnerEnv, child_env

from tests.client.helpers import FakeApi

JOB_TOKEN = "7.1.abcdef:signature"


def test_a_job_gets_the_tracking_uri_and_its_own_credential_never_the_job_token():
    env = RunnerEnv({"SF_API_URL": "http://api:8000/", "SF_JOB_TOKEN": JOB_TOKEN})
    child = child_env(env)
    assert child[TRACKING_URI_VAR] == "http://api:8000/mlflow"
    assert child[TRACKING_TOKEN_VAR] == tracking_token(JOB_TOKEN)
    assert JOB_TOKEN not in json.dumps(child)


def test_a_job_that_names_its_own_tracking_server_keeps_it_and_its_token():
    own = {TRACKING_URI_VAR: "http://mlflow.example:5000", TRACKING_TOKEN_VAR: "theirs"}
    env = RunnerEnv(
        {"SF_API_URL": "http://api", "SF_JOB_TOKEN": JOB_TOKEN, USER_ENV_VAR: json.dumps(own)}
    )
    child = child_env(env)
    assert (child[TRACKING_URI_VAR], child[TRACKING_TOKEN_VAR]) == tuple(own.values())
    only_uri = {USER_ENV_VAR: json.dumps({TRACKING_URI_VAR: "file:///tmp/mlruns"})}
    environ = {"SF_API_URL": "http://api", "SF_JOB_TOKEN": JOB_TOKEN, **only_uri}
    child = child_env(RunnerEnv(environ))
    assert child[TRACKING_URI_VAR] == "file:///tmp/mlruns" and TRACKING_TOKEN_VAR not in child


@pytest.mark.parametrize(
    "environ",
    [
        {"SF_JOB_TOKEN": JOB_TOKEN},  # offline: no API
        {"SF_API_URL": "http://api"},  # no credential yet (nor a bootstrap exchanged)
        {"SF_API_URL": "http://api", "SF_JOB_TOKEN": "no-job-token-shape"},
    ],
)
def test_without_an_api_or_a_job_token_a_job_gets_neither_variable(environ):
    child = environment.child_env(RunnerEnv(environ))
    assert TRACKING_URI_VAR not in child and TRACKING_TOKEN_VAR not in child


@pytest.mark.parametrize(
    ("method", "target", "passes"),
    [
        ("POST", "/mlflow/api/2.0/mlflow/runs/log-batch", True),
        ("GET", "/mlflow/api/2.0/mlflow/metrics/get-history?run_id=1&metric_key=a", True),
        ("GET", "/mlflow/ajax-api/2.0/mlflow/runs/get?run_id=1", True),
        ("PUT", "/mlflow/api/2.0/mlflow/runs/log-batch", False),
        ("DELETE", "/mlflow/api/2.0/mlflow/runs/delete", False),
        ("GET", "/api/v1/jobs", False),
        ("GET", "/mlflow", False),
        ("GET", "/mlflowx/api", False),
        ("GET", "/mlflow/../api/v1/jobs", False),
        ("GET", "/mlflow/./api", False),
        ("GET", "/mlflow/%2e%2e/api/v1/jobs", False),
        ("GET", "/mlflow/%2E%2E%2Fapi/v1/jobs", False),
        ("GET", "/mlflow/..%2fapi", False),
        ("GET", "/mlflow/x\\..\\..\\api", False),
        ("GET", "/mlflow//api", False),
        ("GET", "/mlflow/api\x00", False),
        ("GET", "/mlflow/api\u00e9", False),
        ("GET", "http://elsewhere/mlflow/api", False),
    ],
)
def test_only_tracking_requests_that_stay_below_the_root_pass(method, target, passes):
    assert tracking.allowed(method, target) is passes


@pytest.fixture
def api() -> Iterator[FakeApi]:
    api = FakeApi()
    thread = threading.Thread(target=api.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield api
    api.server.shutdown()
    api.server.server_close()


def forwarder_to(url: str) -> tracking.Forwarder:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    forwarder = tracking.Forwarder(listener, url)
    forwarder.start()
    return forwarder


@pytest.fixture
def forwarder(api) -> Iterator[tracking.Forwarder]:
    forwarder = forwarder_to(api.url)
    yield forwarder
    forwarder.close()


def connection(forwarder: tracking.Forwarder) -> http.client.HTTPConnection:
    port = forwarder.listener.getsockname()[1]
    return http.client.HTTPConnection("127.0.0.1", port, timeout=10)


def ask(conn, method: str, target: str, body: bytes | None = None, **headers: str):
    conn.request(method, target, body=body, headers=headers)
    answer = conn.getresponse()
    return answer.status, answer.read(), answer


def test_a_tracking_request_reaches_the_server_with_the_jobs_credential_and_comes_back(
    api, forwarder
):
    api.route("POST /mlflow/api/2.0/mlflow/runs/log-batch", lambda req: (200, {"ok": 1}))
    api.route("GET /mlflow/api/2.0/mlflow/runs/get", lambda req: (404, {"error_code": "X"}))
    assert forwarder.uri == f"http://127.0.0.1:{forwarder.listener.getsockname()[1]}/mlflow"
    conn = connection(forwarder)
    body = json.dumps({"run_id": "1", "metrics": [{"key": "loss", "value": 1.5}]}).encode()
    status, raw, _ = ask(
        conn,
        "POST",
        "/mlflow/api/2.0/mlflow/runs/log-batch",
        body,
        **{"Content-Type": "application/json", "Authorization": "Bearer sft.7.1.x"},
        **{"Cookie": "sessionid=stolen", "X-Forwarded-For": "10.0.0.1"},
    )
    assert (status, json.loads(raw)) == (200, {"ok": 1})
    # The same connection again (MLflow's client keeps it alive): the server's 404 as it was.
    status, raw, _ = ask(conn, "GET", "/mlflow/api/2.0/mlflow/runs/get?run_id=1")
    assert (status, json.loads(raw)) == (404, {"error_code": "X"})
    sent = api.requests[0]
    assert (sent.method, sent.path, sent.body) == ("POST", sent.path, body)
    assert sent.headers["Authorization"] == "Bearer sft.7.1.x"
    assert "Cookie" not in sent.headers and "X-Forwarded-For" not in sent.headers
    assert api.requests[1].query == {"run_id": "1"}


def mlflow_error(raw: bytes) -> str:
    answer = json.loads(raw)
    assert set(answer) == {"error_code", "message"} and answer["message"]
    return answer["error_code"]


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/api/v1/jobs"),
        ("POST", "/api/v1/ingest/metrics"),
        ("GET", "/mlflow/../api/v1/jobs"),
        ("GET", "/mlflow/%2e%2e/api/v1/jobs"),
        ("PUT", "/mlflow/api/2.0/mlflow/runs/update"),
        ("GET", "/"),
    ],
)
def test_anything_else_is_an_mlflow_shaped_404_that_never_reaches_the_server(
    api, forwarder, method, target
):
    status, raw, answer = ask(connection(forwarder), method, target)
    assert status == 404 and answer.getheader("Content-Type") == "application/json"
    assert mlflow_error(raw) == "ENDPOINT_NOT_FOUND"
    assert api.requests == []


def raw_exchange(forwarder: tracking.Forwarder, data: bytes) -> bytes:
    with socket.create_connection(forwarder.listener.getsockname()[:2], timeout=10) as conn:
        conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"POST /mlflow/x HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n", 413),
        (b"POST /mlflow/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411),
        (b"GET /mlflow/x HTTP/1.1\r\n" + b"X-Pad: " + b"a" * (70 << 10) + b"\r\n\r\n", 431),
        (b"GET /mlflow/x HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"GET /mlflow/x\r\n\r\n", 400),
        (b"POST /mlflow/x HTTP/1.1\r\nContent-Length: 10\r\n\r\nshort", 400),
    ],
)
def test_a_malformed_or_oversized_request_is_refused_and_its_connection_closed(
    api, forwarder, data, status
):
    answer = raw_exchange(forwarder, data)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == str(status).encode()
    assert mlflow_error(body)
    assert api.requests == []


def test_a_server_that_cannot_be_reached_is_an_mlflow_shaped_502(api):
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{spare.getsockname()[1]}"
    forwarder = forwarder_to(down)
    try:
        status, raw, _ = ask(connection(forwarder), "GET", "/mlflow/api/2.0/mlflow/runs/get")
    finally:
        forwarder.close()
    assert status == 502 and mlflow_error(raw) == "TEMPORARILY_UNAVAILABLE"


def test_a_close_returns_at_once_while_a_job_holds_connections_open(api, forwarder):
    idle = [socket.create_connection(forwarder.listener.getsockname()[:2]) for _ in range(3)]
    idle[0].sendall(b"POST /mlflow/x HTTP/1.1\r\nContent-Length: 100\r\n\r\nhalf")
    time.sleep(0.2)
    began = time.monotonic()
    forwarder.close()
    assert time.monotonic() - began < 1.0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", forwarder.listener.getsockname()[1]), timeout=2)
    for conn in idle:
        conn.close()


def test_an_invalid_api_url_is_refused_with_a_sentence():
    with socket.socket() as listener, pytest.raises(ValueError, match="invalid API URL"):
        tracking.Forwarder(listener, "ftp://nowhere")


# In a process of its own (as the runner is): a sandbox, a socket listening inside it, and a
# client inside that reaches it while nothing on the host's loopback answers there.
LISTEN_INSIDE = """
import json, socket, subprocess, sys
from sf.sandbox import Sandbox, SandboxConfig
sandbox = Sandbox.open(SandboxConfig(int(sys.argv[1])), [sys.argv[2]], sys.argv[2])
try:
    listener = sandbox.listen_inside()
    host, port = listener.getsockname()
    probe = (
        "import socket, sys; c = socket.create_connection(('127.0.0.1', int(sys.argv[1])), 3);"
        "c.sendall(b'inside'); print(c.recv(9).decode())"
    )
    argv = sandbox.enter([sys.executable, "-c", probe, str(port)], "/", None, None)
    inside = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    conn, _ = listener.accept()
    said = conn.recv(6).decode()
    conn.sendall(b"outside")
    conn.close()
    out = inside.communicate(timeout=10)[0].strip()
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        host_side = "reached"
    except OSError:
        host_side = "refused"
    print(json.dumps({"host": host, "said": said, "answered": out, "host_side": host_side}))
finally:
    sandbox.close()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root")
def test_a_socket_made_inside_the_sandbox_listens_on_its_loopback_not_the_hosts(tmp_path):
    tmp_path.chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-c", LISTEN_INSIDE, "65533", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {
        "host": "127.0.0.1",
        "said": "inside",
        "answered": "outside",
        "host_side": "refused",
    }
