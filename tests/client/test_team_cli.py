"""`sf team list|show|add-member|remove-member|set-role` against the real server (live_server):
what the CLI prints and changes, and that the API's refusals reach the user as one `error:`
line with exit 1 (argparse's own refusals: exit 2)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from jobs.models import Membership

pytestmark = pytest.mark.django_db(transaction=True)
Sf = Callable[..., tuple[int, str, str]]


@pytest.fixture
def admin(alice, team) -> None:
    """alice administers vision."""
    Membership.objects.filter(user=alice, team=team).update(role=Membership.Role.ADMIN)


def role_of(username: str, team_name: str = "vision") -> str | None:
    m = Membership.objects.filter(user__username=username, team__name=team_name).first()
    return m.role if m else None


# -- list --------------------------------------------------------------------------------------
def test_list_shows_each_team_with_my_role_its_member_count_quota_and_can_manage(
    sf, alice, admin, team, make_team, make_user
) -> None:
    make_user("bob", team)
    audio = make_team("audio", gpu_quota=4)
    Membership.objects.create(team=audio, user=alice, role=Membership.Role.VIEWER)
    code, out, err = sf("team", "list")
    assert code == 0, err
    head, *rows = [line.split() for line in out.splitlines()]
    assert head == ["NAME", "ROLE", "MEMBERS", "GPU", "QUOTA", "CAN", "MANAGE"]
    assert rows == [["audio", "viewer", "1", "4", "no"], ["vision", "admin", "2", "8", "yes"]]


def test_list_json_prints_the_apis_answer(sf, admin, team, make_user) -> None:
    make_user("bob", team, role="viewer")
    code, out, err = sf("team", "list", "--json")
    assert code == 0, err
    [vision] = json.loads(out)
    assert (vision["name"], vision["role"], vision["can_manage"]) == ("vision", "admin", True)
    assert vision["members"] == [
        {"username": "alice", "role": "admin"},
        {"username": "bob", "role": "viewer"},
    ]
    assert vision["quotas"]["gpu_quota"] == 8


# -- show --------------------------------------------------------------------------------------
def test_show_prints_quotas_defaults_and_members_with_their_roles(sf, team, make_user) -> None:
    make_user("bob", team, role="admin")
    team.max_jobs, team.default_time_limit_s, team.default_retry_cooldown_s = 3, 5400, 120
    team.save()
    code, out, err = sf("team", "show", "vision")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[:3] == [
        "team:                vision",
        "my role:             member",
        "can manage:          no",
    ]
    for line in (
        "quotas (set by staff):",
        "  gpu quota:         8",
        "  max jobs:          3",
        "  gpu-hours/month:   none",
        "defaults:",
        "  cluster:           local",
        "  window:            none",
        "  retry cooldown:    2m",
        "  time limit:        1h30m",
    ):
        assert line in lines
    assert lines[-3:] == ["members (2):", "  alice  member", "  bob    admin"]


def test_show_json_prints_the_apis_answer(sf, admin) -> None:
    code, out, err = sf("team", "show", "vision", "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["name"] == "vision" and answer["can_manage"] is True
    assert answer["defaults"]["default_cluster"] == "local"
    assert answer["members"] == [{"username": "alice", "role": "admin"}]


def test_show_a_team_i_am_not_in_prints_the_servers_sentence_and_exits_1(sf, make_team) -> None:
    make_team("secret")
    code, out, err = sf("team", "show", "secret")
    assert (code, out) == (1, "")
    assert err == "error: team secret does not exist or you are not in it\n"


# -- add-member, set-role, remove-member as the team's admin -----------------------------------
def test_admin_adds_a_member_as_member_by_default(sf, admin, make_user) -> None:
    make_user("bob")
    code, out, err = sf("team", "add-member", "vision", "bob")
    assert (code, out) == (0, "added bob to team vision as member\n"), err
    assert role_of("bob") == "member"


def test_admin_adds_a_member_with_a_role(sf, admin, make_user) -> None:
    make_user("bob")
    code, out, err = sf("team", "add-member", "vision", "bob", "--role", "viewer")
    assert (code, out) == (0, "added bob to team vision as viewer\n"), err
    assert role_of("bob") == "viewer"


def test_admin_sets_a_members_role(sf, admin, team, make_user) -> None:
    make_user("bob", team)
    code, out, err = sf("team", "set-role", "vision", "bob", "admin")
    assert (code, out) == (0, "bob is now admin in team vision\n"), err
    assert role_of("bob") == "admin"


def test_admin_removes_a_member(sf, admin, team, make_user) -> None:
    make_user("bob", team)
    code, out, err = sf("team", "remove-member", "vision", "bob")
    assert (code, out) == (0, "removed bob from team vision\n"), err
    assert role_of("bob") is None


# -- refusals ------------------------------------------------------------------------------------
def test_a_plain_member_adding_someone_gets_the_servers_403_sentence(sf, make_user) -> None:
    make_user("bob")
    code, out, err = sf("team", "add-member", "vision", "bob")
    assert (code, out) == (1, "")
    assert err == "error: only team admins of team vision can manage its members\n"
    assert role_of("bob") is None


def test_adding_an_unknown_user_is_refused_with_the_servers_sentence(sf, admin) -> None:
    code, out, err = sf("team", "add-member", "vision", "carol")
    assert (code, out) == (1, "")
    assert err == "error: unknown user 'carol'; staff create users in the admin\n"


def test_adding_someone_already_in_the_team_is_refused(sf, admin, team, make_user) -> None:
    make_user("bob", team, role="viewer")
    code, _, err = sf("team", "add-member", "vision", "bob", "--role", "admin")
    assert code == 1
    assert err == ("error: bob is already in team vision as viewer; change their role instead\n")
    assert role_of("bob") == "viewer"


def test_removing_the_last_admin_is_refused_with_the_servers_sentence(sf, admin) -> None:
    code, out, err = sf("team", "remove-member", "vision", "alice")
    assert (code, out) == (1, "")
    assert err == (
        "error: alice is the last admin of team vision: make another member admin "
        "before you remove them\n"
    )
    assert role_of("alice") == "admin"


def test_demoting_the_last_admin_is_refused_with_the_servers_sentence(sf, admin) -> None:
    code, _, err = sf("team", "set-role", "vision", "alice", "member")
    assert code == 1
    assert err == (
        "error: alice is the last admin of team vision: make another member admin "
        "before you make them member\n"
    )
    assert role_of("alice") == "admin"


def test_removing_someone_not_in_the_team_is_refused(sf, admin, make_user) -> None:
    make_user("bob")
    code, _, err = sf("team", "remove-member", "vision", "bob")
    assert (code, err) == (1, "error: bob is not a member of team vision\n")


def test_an_unknown_role_is_a_usage_error_before_any_request(sf, admin, team, make_user) -> None:
    make_user("bob", team)
    code, _, err = sf("team", "set-role", "vision", "bob", "owner")
    assert code == 2
    assert "invalid choice: 'owner'" in err
    assert role_of("bob") == "member"


def test_team_alone_shows_its_verbs_and_exits_2(sf) -> None:
    code, _, err = sf("team")
    assert code == 2
    assert "add-member" in err and "set-role" in err
