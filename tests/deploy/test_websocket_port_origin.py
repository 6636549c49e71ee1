"""Where the websocket server has a port of its own (`make run`: SF_WS_PORT), its handshakes
come from pages of the web server's port (SF_PORT) on the same host name, and from nowhere else."""

import pytest

from tests.sockets import accepted, handshake

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("in_memory_layer")]


@pytest.fixture(autouse=True)
def split_ports(settings):
    settings.SF_PORT = 8000
    settings.SF_WS_PORT = 8001


def test_the_consoles_pages_on_the_web_port_may_open_websockets():
    assert accepted(handshake("http://testserver:8000", host="testserver:8001"))


@pytest.mark.parametrize(
    "origin",
    [
        "http://testserver:8001",  # the websocket server's own port serves no console page
        "http://testserver",
        "http://testserver:8002",
        "https://testserver:8000",
        "http://evil.example:8000",
    ],
)
def test_any_other_origin_is_refused(origin):
    assert not accepted(handshake(origin, host="testserver:8001"))


def test_a_handshake_that_reached_another_port_is_refused():
    # Through a proxy that forwards another port, only origins listed in SF_ALLOWED_ORIGINS.
    assert not accepted(handshake("http://testserver:8000", host="testserver:8000"))
    assert not accepted(handshake("http://testserver:8000", host="testserver"))


def test_a_host_outside_allowed_hosts_is_refused(settings):
    settings.DEBUG = False
    settings.ALLOWED_HOSTS = ["starforge.example.com"]
    assert not accepted(handshake("http://evil.example:8000", host="evil.example:8001"))
    assert accepted(
        handshake("http://starforge.example.com:8000", host="starforge.example.com:8001")
    )
