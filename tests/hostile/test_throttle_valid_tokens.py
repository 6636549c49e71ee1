"""A flood of junk credentials from one address never locks out a valid one from that address.

Every local job, and every user behind one proxy, shares an address: if junk tokens from there
could make a valid token's request 429, one job could fail every other job starting on the
host (the runner's snapshot download) and lock its users out of the API.
"""

import pytest
from django.test import Client

from jobs.actions.tokens import create_token
from jobs.job_tokens import job_token
from tests.api_helpers import assert_refused, submit
from tests.ingesting import attach_attempt

pytestmark = pytest.mark.django_db
SHARED = "10.9.8.7"  # the address of a host running many jobs, or of a proxy


def bearer(secret: str, address: str = SHARED) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {secret}", REMOTE_ADDR=address)


def junk_flood(count: int = 40) -> None:
    for n in range(count):
        assert bearer(f"sf_junk{n}").get("/api/v1/me").status_code in {401, 429}


def test_forty_junk_tokens_then_a_valid_user_token_from_the_same_address_is_served(alice):
    secret = create_token(alice, "laptop")[1]
    junk_flood()
    assert bearer(secret).get("/api/v1/me").status_code == 200
    assert_refused(bearer("sf_junk-again").get("/api/v1/me"), 429, "too many unknown tokens")


def test_junk_is_still_counted_from_the_first_limit_on(settings):
    settings.SF_TOKEN_MAX_FAILURES = 20
    for n in range(20):
        assert_refused(bearer(f"sf_junk{n}").get("/api/v1/me"), 401)
    assert_refused(bearer("sf_junk20").get("/api/v1/me"), 429, "try again in")


def test_a_valid_job_token_is_served_after_a_junk_flood(api):
    job_id = submit(api)
    attach_attempt(job_id, 1)
    junk_flood()
    answer = bearer(job_token(job_id, 1)).post(
        "/api/v1/ingest/started", {"attempt": 1}, content_type="application/json"
    )
    assert answer.status_code == 200, answer.content


def test_the_junk_address_does_not_lock_out_the_metrics_scrape_of_a_staff_token(alice):
    alice.is_staff = True
    alice.save()
    secret = create_token(alice, "prometheus")[1]
    for n in range(40):
        assert bearer(f"sf_junk{n}").get("/metrics").status_code in {401, 429}
    assert bearer(secret).get("/metrics").status_code == 200
    assert bearer("sf_junk-again").get("/metrics").status_code == 429


def sign_in(username: str, password: str, address: str = SHARED):
    return Client().post(
        "/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=address
    )


def test_failed_sign_ins_for_other_usernames_do_not_lock_a_user_out(alice, settings):
    settings.SF_LOGIN_MAX_FAILURES = 3
    for n in range(40):
        assert sign_in(f"someone{n % 5}", "wrong").status_code in {200, 429}
    assert sign_in("alice", "pw").status_code == 302


def test_failures_for_the_same_username_still_throttle_it(alice, settings):
    settings.SF_LOGIN_MAX_FAILURES = 3
    for _ in range(3):
        assert sign_in("alice", "wrong").status_code == 200
    assert sign_in("alice", "pw").status_code == 429  # that account's brute-force protection
