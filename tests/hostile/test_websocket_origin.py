"""Issue 12, point 9: a websocket opens only from the console's own origin.

A browser sends the session cookie with any page's websocket handshake, so another site's page
(or another port or scheme on the same host) could otherwise stream a signed-in user's jobs.
"""

import pytest

from tests.factories import queued_job
from tests.sockets import accepted, handshake, session_of

pytestmark = pytest.mark.usefixtures("in_memory_layer")

SITE = "starforge.example.com"


@pytest.fixture
def production(settings):
    """The host names as settings_prod has them, TLS in front."""
    settings.DEBUG = False
    settings.ALLOWED_HOSTS = [SITE]


@pytest.mark.django_db(transaction=True)
def test_another_sites_page_cannot_open_a_signed_in_users_job_stream(team, alice):
    job = queued_job(team, alice)
    session = session_of(alice)
    path = f"/ws/jobs/{job.pk}/"
    assert not accepted(handshake("http://evil.example", session=session, path=path))
    assert not accepted(handshake("http://testserver.evil.example", session=session, path=path))
    assert accepted(handshake("http://testserver", session=session, path=path))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "origin",
    [
        None,  # no Origin header at all
        "null",  # a sandboxed frame or a file:// page
        "http://testserver:8001",  # another port of the same host
        "https://testserver",  # the https site is not the http one
        "http://evil.example",
        "http://testserver/",  # an Origin is scheme://host[:port], nothing more
        "http://user@testserver",
    ],
)
def test_the_default_settings_refuse_any_origin_but_the_sites_own(origin):
    assert not accepted(handshake(origin))


@pytest.mark.django_db(transaction=True)
def test_two_origin_headers_are_refused():
    twice = [(b"origin", b"http://evil.example")]
    assert not accepted(handshake("http://testserver", extra=twice))


@pytest.mark.django_db(transaction=True)
def test_the_default_port_may_be_written_or_not():
    assert accepted(handshake("http://testserver:80"))
    assert accepted(handshake("http://testserver:8000", host="testserver:8000"))
    assert not accepted(handshake("http://testserver:8000", host="testserver:8001"))


@pytest.mark.django_db(transaction=True)
def test_production_matches_scheme_host_and_port_not_just_the_host(production):
    assert accepted(handshake(f"https://{SITE}", host=SITE, scheme="wss"))
    assert not accepted(handshake(f"https://{SITE}:8443", host=SITE, scheme="wss"))
    assert not accepted(handshake(f"http://{SITE}", host=SITE, scheme="wss"))
    assert not accepted(handshake(f"https://{SITE}", host=SITE, scheme="ws"))
    assert not accepted(handshake(f"https://evil.{SITE}", host=SITE, scheme="wss"))


@pytest.mark.django_db(transaction=True)
def test_a_host_outside_allowed_hosts_is_refused_even_when_the_origin_matches_it(production):
    # DNS rebinding: the attacker's name pointed at this server, Origin and Host both theirs.
    assert not accepted(handshake("https://evil.example", host="evil.example", scheme="wss"))


@pytest.mark.django_db(transaction=True)
def test_behind_a_tls_proxy_the_forwarded_scheme_counts(production, settings):
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    tls = [(b"x-forwarded-proto", b"https")]
    plain = [(b"x-forwarded-proto", b"http")]
    assert accepted(handshake(f"https://{SITE}", host=SITE, extra=tls))
    assert not accepted(handshake(f"http://{SITE}", host=SITE, extra=tls))
    assert not accepted(handshake(f"https://{SITE}", host=SITE, scheme="wss", extra=plain))


@pytest.mark.django_db(transaction=True)
def test_a_proxy_that_rewrites_host_needs_its_origin_listed(production, settings):
    settings.ALLOWED_HOSTS = [SITE, "10.0.0.5"]
    rewritten = {"host": "10.0.0.5:8000", "scheme": "ws"}
    assert not accepted(handshake(f"https://{SITE}", **rewritten))
    settings.SF_ALLOWED_ORIGINS = [f"https://{SITE}"]
    assert accepted(handshake(f"https://{SITE}", **rewritten))
    assert not accepted(handshake(f"https://{SITE}:444", **rewritten))
    assert not accepted(handshake(f"http://{SITE}", **rewritten))
