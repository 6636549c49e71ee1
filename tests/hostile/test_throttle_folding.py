"""The sign-in throttle counts a username as the sign-in form reads it (issue 47, point 5).

Django's sign-in form folds a username by NFKC, so "ａｌｉｃｅ" (full-width letters) signs in as
alice. A throttle that counted each spelling apart gave every spelling SF_LOGIN_MAX_FAILURES
fresh tries at alice's password: 2^5 spellings of five letters, 320 guesses instead of 10.
"""

import itertools
import unicodedata

import pytest
from django.test import Client

from jobs.throttle import sign_in_name

pytestmark = pytest.mark.django_db
FULL_WIDTH = {c: chr(ord(c) - ord("a") + ord("ａ")) for c in "abcdefghijklmnopqrstuvwxyz"}


def spellings(name: str) -> list[str]:
    """Every spelling of `name` mixing ASCII and full-width letters; all NFKC-equal."""
    return ["".join(s) for s in itertools.product(*((c, FULL_WIDTH[c]) for c in name))]


def sign_in(password: str, username: str):
    return Client().post(
        "/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR="10.0.0.1"
    )


def test_every_spelling_the_form_folds_to_one_account_signs_in_to_it(alice):
    # What makes the finding real: the form signs these spellings in as alice.
    assert sign_in("pw", FULL_WIDTH["a"] + "lice").status_code == 302


def test_other_spellings_of_a_name_share_its_failure_count(alice, settings):
    settings.SF_LOGIN_MAX_FAILURES = 10
    tried = spellings("alice")[:10]
    assert len(set(tried)) == 10
    assert {unicodedata.normalize("NFKC", s) for s in tried} == {"alice"}
    for username in tried:
        assert sign_in("wrong", username).status_code == 200
    for username in ("alice", spellings("alice")[-1], " ＡＬＩＣＥ "):
        refused = sign_in("pw", username)
        assert refused.status_code == 429, username
        assert "Too many failed sign-ins" in refused.content.decode()


def test_the_admins_sign_in_counts_the_same_spellings_together(alice, settings):
    alice.is_staff = True
    alice.save()
    settings.SF_LOGIN_MAX_FAILURES = 2
    sign_in("wrong", "ａlice")
    Client().post(
        "/admin/login/", {"username": "aｌice", "password": "wrong"}, REMOTE_ADDR="10.0.0.1"
    )
    refused = Client().post(
        "/admin/login/", {"username": "alice", "password": "pw"}, REMOTE_ADDR="10.0.0.1"
    )
    assert refused.status_code == 429


@pytest.mark.parametrize(
    "spelling",
    ["alice", " alice\t", "ALICE", "ａｌｉｃｅ", "Ａｌｉｃｅ", "ａlice"],
)
def test_sign_in_name_folds_what_the_form_folds(spelling):
    assert sign_in_name(spelling) == "alice"


def test_sign_in_name_keeps_names_the_form_keeps_apart():
    assert sign_in_name("alice") != sign_in_name("alicé")
    assert sign_in_name("bob") != sign_in_name("b0b")
