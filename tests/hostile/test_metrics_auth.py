"""`/metrics` needs a credential by default, from loopback too.

Jobs on the local executor run on the server's loopback, so trusting loopback let any job read
every team's series. A scrape now needs the scrape token an admin configured (SF_METRICS_TOKEN)
or a staff user's API token; trusting a network is an explicit setting, empty by default.
"""

import os

import pytest
from django.test import Client

from jobs.actions.tokens import create_token

pytestmark = pytest.mark.django_db
SCRAPE = "a-scrape-token-that-an-admin-configured-0123456789"


def scrape(address: str, authorization: str = ""):
    extra = {"HTTP_AUTHORIZATION": authorization} if authorization else {}
    return Client(REMOTE_ADDR=address, **extra).get("/metrics")


@pytest.fixture
def scrape_token(settings):
    settings.SF_METRICS_TOKEN = SCRAPE


@pytest.mark.skipif("SF_METRICS_ALLOWED_NETS" in os.environ, reason="an admin trusted a network")
def test_no_network_is_trusted_unless_an_admin_says_so(settings):
    assert settings.SF_METRICS_ALLOWED_NETS == []


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "::ffff:127.0.0.1"])
def test_loopback_without_credentials_gets_401_with_a_sentence(team, address):
    response = scrape(address)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    body = response.content.decode()
    assert body.startswith("Metrics need a credential") and body.endswith(".\n")
    assert "starforge_" not in body


def test_the_scrape_token_reads_the_metrics(team, scrape_token):
    response = scrape("127.0.0.1", f"Bearer {SCRAPE}")
    assert response.status_code == 200
    assert "starforge_jobs" in response.content.decode()


def test_a_staff_token_reads_the_metrics(alice):
    alice.is_staff = True
    alice.save()
    assert scrape("127.0.0.1", f"Bearer {create_token(alice, 'p')[1]}").status_code == 200


def test_a_token_of_a_user_who_is_not_staff_gets_403(alice):
    response = scrape("127.0.0.1", f"Bearer {create_token(alice, 'p')[1]}")
    assert response.status_code == 403
    assert response.content.decode().endswith(".\n")


def test_a_guess_at_the_scrape_token_is_401(team, scrape_token):
    for guess in (SCRAPE[:-1], SCRAPE + "x", "", "Bearer"):
        assert scrape("127.0.0.1", f"Bearer {guess}").status_code == 401


def test_an_unconfigured_scrape_token_matches_nothing(team, settings):
    settings.SF_METRICS_TOKEN = ""
    assert scrape("127.0.0.1", "Bearer ").status_code == 401


def test_a_network_an_admin_trusts_reads_without_credentials(team, settings):
    settings.SF_METRICS_ALLOWED_NETS = ["192.0.2.0/24"]
    assert scrape("192.0.2.10").status_code == 200
    assert scrape("127.0.0.1").status_code == 401
