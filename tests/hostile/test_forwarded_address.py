"""Behind trusted reverse proxies the throttles count each client, and no client picks its own
address: X-Forwarded-For is read from the right, past the proxies an admin listed, and only on
a connection from one of them."""

import pytest
from django.test import Client, RequestFactory

from jobs.addresses import client_address

pytestmark = pytest.mark.django_db
PROXY = "10.0.0.5"


@pytest.fixture
def proxied(settings):
    settings.SF_TRUSTED_PROXIES = ["10.0.0.0/24", "fd00::/8"]
    settings.SF_TOKEN_MAX_FAILURES = 5


def seen(remote: str, forwarded: str | None = None) -> str:
    extra = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded is not None else {}
    return client_address(RequestFactory().get("/", REMOTE_ADDR=remote, **extra))


@pytest.mark.parametrize(
    ("remote", "forwarded", "client"),
    [
        (PROXY, "198.51.100.7", "198.51.100.7"),  # one proxy
        (PROXY, "198.51.100.7, 10.0.0.9", "198.51.100.7"),  # two proxies in a row
        (PROXY, "1.2.3.4, 198.51.100.7", "198.51.100.7"),  # the client forged the left part
        (PROXY, "forged, 198.51.100.7", "198.51.100.7"),
        (PROXY, "198.51.100.7, not-an-address", PROXY),  # not what a proxy writes
        (PROXY, "", PROXY),
        (PROXY, None, PROXY),
        (PROXY, "10.0.0.7", "10.0.0.7"),  # from inside the proxies' own network
        ("::ffff:10.0.0.5", "2001:db8::1", "2001:db8::1"),  # IPv4-mapped proxy, IPv6 client
        ("fd00::1", "198.51.100.8", "198.51.100.8"),
        ("203.0.113.9", "198.51.100.7", "203.0.113.9"),  # not a proxy: the header is ignored
    ],
)
def test_the_client_is_the_address_the_nearest_trusted_proxy_saw(
    proxied, remote, forwarded, client
):
    assert seen(remote, forwarded) == client


def test_without_trusted_proxies_the_header_is_ignored(settings):
    assert settings.SF_TRUSTED_PROXIES == []
    assert seen(PROXY, "198.51.100.7") == PROXY


def junk(forwarded: str, n: int) -> int:
    client = Client(HTTP_AUTHORIZATION=f"Bearer sf_junk{n}", REMOTE_ADDR=PROXY)
    return client.get("/api/v1/me", HTTP_X_FORWARDED_FOR=forwarded).status_code


def test_one_client_flooding_junk_through_the_proxy_is_throttled_alone(proxied):
    assert [junk("198.51.100.7", n) for n in range(5)] == [401] * 5
    assert junk("198.51.100.7", 5) == 429
    # forging its own address to the left of what the proxy appended changes nothing
    assert junk("192.0.2.44, 198.51.100.7", 6) == 429
    assert junk("198.51.100.8", 7) == 401  # another client behind the same proxy


def test_a_trusted_metrics_network_is_the_clients_not_the_proxys(proxied, settings):
    settings.SF_METRICS_ALLOWED_NETS = ["10.0.0.0/24"]  # the proxies' own network
    via_proxy = Client(REMOTE_ADDR=PROXY).get("/metrics", HTTP_X_FORWARDED_FOR="198.51.100.7")
    assert via_proxy.status_code == 401 and b"Metrics need a credential" in via_proxy.content
    settings.SF_METRICS_ALLOWED_NETS = ["198.51.100.0/24"]
    via_proxy = Client(REMOTE_ADDR=PROXY).get("/metrics", HTTP_X_FORWARDED_FOR="198.51.100.7")
    assert via_proxy.status_code == 200
