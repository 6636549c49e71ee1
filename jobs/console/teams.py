"""The console's Teams pages: a member's teams, and one team's members, quotas and defaults.

Team admins (and staff) manage members and defaults with CSRF-protected forms that call the
same actions as the API (`jobs.actions.teams`); a refusal comes back as a message on the team
page.
"""

from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from jobs.actions import teams as team_actions
from jobs.errors import ApiError, Forbidden, NotFound
from jobs.models import TIME_LIMIT_MAX_S, ScheduleWindow
from jobs.reads import outsiders, teams


@login_required
def team_list(request):
    rows = [
        {"team": team, "role": teams.role_of(request.user, team)}
        for team in teams.visible_teams(request.user)
    ]
    return render(request, "jobs/teams.html", {"rows": rows})


@login_required
def team_detail(request, name: str):
    try:
        team = teams.get_team(request.user, name)
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    can_manage = teams.can_manage(request.user, team)
    return render(
        request,
        "jobs/team.html",
        {
            "team": team,
            "members": team.memberships,  # type: ignore[attr-defined]
            "role": teams.role_of(request.user, team),
            "can_manage": can_manage,
            "inherited": outsiders.inherited(team) if can_manage else [],
            "roles": team_actions.ROLES,
            "clusters": teams.cluster_names(team),  # only those it may use (jobs.grants)
            "windows": ScheduleWindow.objects.order_by("name").values_list("name", flat=True),
            "max_retries_limit": team_actions.MAX_RETRIES_LIMIT,
            "cooldown_limit": team_actions.RETRY_COOLDOWN_LIMIT_S,
            "time_limit_max": TIME_LIMIT_MAX_S,
        },
    )


@login_required
@require_POST
def member_add(request, name: str):
    username, role = request.POST.get("username", "").strip(), request.POST.get("role", "member")
    return _act(
        request,
        name,
        lambda: team_actions.add_member(request.user, name, username, role),
        f"{username} added to team {name} as {role}",
    )


@login_required
@require_POST
def member_role(request, name: str, username: str):
    role = request.POST.get("role", "")
    return _act(
        request,
        name,
        lambda: team_actions.change_role(request.user, name, username, role),
        f"{username} is now {role} in team {name}",
    )


@login_required
@require_POST
def member_remove(request, name: str, username: str):
    return _act(
        request,
        name,
        lambda: team_actions.remove_member(request.user, name, username),
        f"{username} removed from team {name}",
    )


@login_required
@require_POST
def team_defaults(request, name: str):
    def save() -> None:
        changes = {
            "default_cluster": request.POST.get("default_cluster", "").strip() or None,
            "window": request.POST.get("window", "").strip() or None,
            "default_max_retries": _whole("default_max_retries", request.POST),
            "default_retry_cooldown_s": _whole("default_retry_cooldown_s", request.POST),
            "default_time_limit_s": (  # empty: no limit
                _whole("default_time_limit_s", request.POST)
                if request.POST.get("default_time_limit_s", "").strip()
                else None
            ),
        }
        team_actions.set_defaults(request.user, name, changes)

    return _act(request, name, save, f"defaults of team {name} saved")


def _whole(field: str, form) -> int | str:
    """The field as an int, or its text for the action to refuse with its sentence."""
    text = form.get(field, "").strip()
    return int(text) if text.isdigit() else text


def _act(request, name: str, action: Callable[[], object], done: str) -> HttpResponseRedirect:
    """Run a team action; 404 and 403 as pages, other refusals as a message on the team page."""
    try:
        action()
    except NotFound as exc:
        if not teams.visible_teams(request.user).filter(name=name).exists():
            raise Http404(exc.detail) from exc
        messages.error(request, exc.detail)  # a member who is not there: the team is shown
    except Forbidden as exc:
        raise PermissionDenied(exc.detail) from exc
    except ApiError as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, done)
        if not teams.visible_teams(request.user).filter(name=name).exists():
            return HttpResponseRedirect(reverse("teams"))  # they removed themselves
    return HttpResponseRedirect(reverse("team-detail", args=[name]))
