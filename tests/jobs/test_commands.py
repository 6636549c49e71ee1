"""Management commands an operator types."""

import io

import pytest
from django.core.management import CommandError, call_command

from jobs.auth import hash_token
from jobs.models import ApiToken

pytestmark = pytest.mark.django_db


def test_issue_token_prints_a_token_whose_hash_alone_is_stored(alice):
    out = io.StringIO()
    call_command("issue_token", "alice", "--name", "laptop", stdout=out)
    secret = out.getvalue().strip()
    row = ApiToken.objects.get(key_hash=hash_token(secret))
    assert (row.user, row.name) == (alice, "laptop")
    assert secret not in (row.key_hash, row.prefix)


def test_issue_token_for_an_unknown_user_says_so():
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        call_command("issue_token", "nobody")
