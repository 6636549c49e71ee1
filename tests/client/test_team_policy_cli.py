"""`sf team set NAME idle_after=30m ... hang_action=fail` against the real server: a team admin
sets the policy, a member's try is the server's 403 as one `error:` line, a bad word is refused
before any request."""

from __future__ import annotations

import pytest

from jobs.models import ActivityPolicy, Membership

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_team_admin_sets_the_idle_and_hang_policy(sf, alice, team) -> None:
    Membership.objects.filter(user=alice, team=team).update(role=Membership.Role.ADMIN)
    code, out, err = sf(
        "team", "set", "vision", "idle_after=30m", "idle_grace=5m", "idle_action=stop",
        "hang_after=15m", "hang_action=fail",
    )  # fmt: skip
    assert code == 0, err
    policy = ActivityPolicy.objects.get(team=team)
    assert (policy.idle_after_s, policy.idle_grace_s, policy.idle_action) == (1800, 300, "stop")
    assert (policy.hang_after_s, policy.hang_action) == (900, "fail")
    assert "idle_after=30m" in out and "hang_action=fail" in out
    code, out, err = sf("team", "set", "vision", "hang_after=off")
    assert code == 0, err
    assert ActivityPolicy.objects.get(team=team).hang_after_s is None and "hang_after=off" in out


def test_a_member_cannot_lift_the_policy(sf, alice, team) -> None:
    ActivityPolicy.objects.create(team=team, idle_after_s=600)
    code, _, err = sf("team", "set", "vision", "idle_after=off")
    assert code == 1 and "only team admins" in err
    assert ActivityPolicy.objects.get(team=team).idle_after_s == 600


def test_a_bad_word_is_refused_with_the_keys(sf, alice, team) -> None:
    code, _, err = sf("team", "set", "vision", "idle_action=reboot")
    assert code == 1 and "idle_action pause|stop" in err
    assert not ActivityPolicy.objects.exists()
