"""Invariant 3 on real PostgreSQL: two schedulers at once never over-admit a team's quota."""

import pytest
from django.db import connection

from jobs.models import Team
from tests.loops.racing import race_two_schedulers

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _needs_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("concurrency is proven on PostgreSQL (run by `make test`)")


def test_two_schedulers_at_once_never_exceed_any_quota(make_team, make_user):
    quotas = {"a": 3, "b": 5, "c": 2, "d": 4, "e": 1}
    samples = race_two_schedulers(make_team, make_user, quotas, jobs_per_team=60)
    assert len(samples) > 20
    assert Team.objects.count() == 5
