"""A local job has no network path to the control plane or to other teams (issue 47, point 1).

Run as root, a team's job runs in its attempt's sandbox (`sf.sandbox`): it tries the server's
Redis, PostgreSQL (by TCP and by its unix socket), the web server, a service on the host's
loopback (the websocket server's stand-in), another team's rendezvous port, and an address of
this host that the test made: every one is refused. It still reaches a server in a peer
network namespace the test made (egress works), and a private network only once the operator
allows it. Traffic goes only to loopback and to those namespaces.
"""

import json
import os
import sys
from urllib.parse import urlparse

import pytest

from jobs.models import Job
from tests.factories import queued_job
from tests.local_jobs import finished, run_until, start, texts
from tests.netns import banner_server_here, free_port, peer

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("local_jobs"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs the server to run as root"),
]

# Each target: TCP (host, port, first bytes to send) or a unix socket's path. "reached" only
# when the far end answered: pasta may accept a connection before its far end refuses it.
PROBE = """
import json, socket, sys
out = {}
for name, target in json.loads(sys.argv[1]).items():
    try:
        if isinstance(target, str):
            conn = socket.socket(socket.AF_UNIX)
            conn.settimeout(3)
            conn.connect(target)
            hello = ""
        else:
            host, port, hello = target
            conn = socket.create_connection((host, port), timeout=3)
        with conn:
            conn.settimeout(3)
            if hello:
                conn.sendall(hello.encode("latin-1"))
            out[name] = "reached" if conn.recv(64) or isinstance(target, str) else "closed"
    except OSError as exc:
        out[name] = type(exc).__name__
print(json.dumps(out), flush=True)
"""
PG_SSL_REQUEST = "\x00\x00\x00\x08\x04\xd2\x16\x2f"  # PostgreSQL answers it with one byte
RENDEZVOUS = """
import socket
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
server.settimeout(60)  # a test that fails leaves nothing for long
print("port", server.getsockname()[1], flush=True)
while True:
    conn, _ = server.accept()
    conn.sendall(b"rendezvous\\n")
    conn.close()
"""
PG_SOCKET = "/var/run/postgresql/.s.PGSQL.5432"


def probe(team, user, targets: dict) -> dict:
    job = queued_job(
        team, user, total_gpus=0, entrypoint=[sys.executable, "-c", PROBE, json.dumps(targets)]
    )
    start(job)
    run_until(lambda: finished(job), timeout=60)
    job.refresh_from_db()
    assert job.status == "SUCCEEDED", job.status_reason
    return json.loads(texts(job)[0])


def rendezvous_port(job: Job) -> int:
    run_until(lambda: any(t.startswith("port ") for t in texts(job)))
    return int(next(t for t in texts(job) if t.startswith("port ")).split()[1])


@pytest.fixture
def loopback_service():
    port = free_port()
    server = banner_server_here(port, "service")
    yield port
    server.kill()
    server.wait()


def test_a_job_reaches_nothing_of_the_control_plane_or_another_team(
    settings, live_server, make_team, make_user, team, alice, loopback_service
):
    audio = make_team("audio")
    bob = make_user("bob", audio)
    theirs = queued_job(audio, bob, total_gpus=0, entrypoint=[sys.executable, "-c", RENDEZVOUS])
    start(theirs)
    redis = urlparse(settings.REDIS_URL)
    web = urlparse(live_server.url)
    targets = {
        "redis": ["127.0.0.1", redis.port or 6379, "PING\r\n"],
        "postgres": ["127.0.0.1", 5432, PG_SSL_REQUEST],
        "web": ["127.0.0.1", web.port, "GET / HTTP/1.0\r\n\r\n"],
        "a service on the host's loopback": ["127.0.0.1", loopback_service, ""],
        "the same over IPv6": ["::1", loopback_service, ""],
        "another team's rendezvous": ["127.0.0.1", rendezvous_port(theirs), ""],
    }
    if os.path.exists(PG_SOCKET):
        targets["postgres's unix socket"] = PG_SOCKET
    with peer("sfnet", "198.51.100.1", "198.51.100.2") as host:
        port = free_port()
        host.serve(port, "this host", here=True)
        host.serve(port, "peer")
        targets["an address of this host"] = [host.near_addr, port, ""]
        targets["a server elsewhere"] = [host.addr, port, ""]
        seen = probe(team, alice, targets)
    assert seen.pop("a server elsewhere") == "reached"  # egress works
    assert {name: outcome for name, outcome in seen.items() if outcome == "reached"} == {}


def test_private_networks_are_refused_unless_the_operator_allows_them(settings, team, alice):
    with peer("sfpriv", "10.213.7.1", "10.213.7.2") as host:
        port = free_port()
        host.serve(port, "peer")
        target = {"private": [host.addr, port, ""]}
        assert probe(team, alice, target)["private"] != "reached"
        settings.SF_SANDBOX_ALLOW_NETS = ["10.213.7.0/24"]
        assert probe(team, alice, target)["private"] == "reached"


def test_the_explicit_none_puts_a_job_back_on_the_hosts_loopback(team, alice, loopback_service):
    """The old behaviour needs the cluster's explicit "sandbox": "none" (and this test shows
    the probe does reach what is there to reach)."""
    from jobs.models import Cluster

    cluster = Cluster.objects.get(name="local")
    cluster.settings = {**cluster.settings, "sandbox": "none"}
    cluster.save()
    seen = probe(team, alice, {"service": ["127.0.0.1", loopback_service, ""]})
    assert seen == {"service": "reached"}
