"""The server-rendered console: jobs list, job page with its tabs, control buttons, states help,
and the user's API tokens.

Views read the ledger through the same service functions as the API and call the same actions.
"""

import json
from collections import defaultdict
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseBadRequest, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from jobs.actions import control, tokens
from jobs.errors import ApiError, BadRequest, Forbidden, NotFound
from jobs.ledger.transitions import TransitionRefused
from jobs.models import Attempt, Cluster, Membership
from jobs.reads import audit, diagnostics, teams
from jobs.reads.queue import queue_places, queue_row
from jobs.reads.tokens import user_tokens
from jobs.reads.visible import (
    current_attempt,
    get_visible_job,
    retry_unavailable_reason,
    visible_jobs,
)
from jobs.schemas import text_fault
from jobs.states import VERBS, JobStatus
from metering.activity import job_efficiency
from metering.cost import attempt_costs, job_cost
from metering.prices import shown
from metering.usage import attempt_gpu_seconds, job_gpu_seconds

PAGE_SIZE = 50
ACTIONS = {
    "stop": control.stop_job,
    "pause": control.pause_job,
    "resume": control.resume_job,
    "retry": control.retry_job,
}


@login_required
def job_list(request):
    filters = {
        k: request.GET.get(k, "").strip() for k in ("status", "team", "user", "backend", "q")
    }
    for key, value in filters.items():
        if fault := text_fault(value):  # no name holds one; PostgreSQL cannot even compare it
            return HttpResponseBadRequest(
                f"The {key} filter {fault}.\n", content_type="text/plain; charset=utf-8"
            )
    jobs = visible_jobs(request.user).select_related("team", "user", "cluster", "current_attempt")
    if filters["status"].upper() in JobStatus.values:
        jobs = jobs.filter(status=filters["status"].upper())
    if filters["team"]:
        jobs = jobs.filter(team__name=filters["team"])
    if filters["user"]:
        jobs = jobs.filter(user__username=filters["user"])
    if filters["backend"]:
        jobs = jobs.filter(cluster__kind=filters["backend"])
    if filters["q"]:
        jobs = jobs.filter(name__icontains=filters["q"])
    # Keyset paging by id (ids follow submit order): cheap at any depth, unlike OFFSET.
    oldest_first = request.GET.get("order") == "oldest"
    cursor = request.GET.get("after" if oldest_first else "before", "")
    if cursor.isdigit():
        jobs = jobs.filter(**{"pk__gt" if oldest_first else "pk__lt": int(cursor)})
    page = list(jobs.order_by("pk" if oldest_first else "-pk")[: PAGE_SIZE + 1])
    more = len(page) > PAGE_SIZE
    page = page[:PAGE_SIZE]
    rows = [queue_row(job) for job in page]
    places = queue_places(rows, request.user.is_staff)
    for job in page:
        attempt = job.current_attempt  # its lender is another team's and not shown
        job.borrowed = (  # type: ignore[attr-defined]
            attempt is not None and attempt.borrowed_from_id is not None
        ) and job.status in JobStatus.active()
        place = places[job.pk]
        job.queue_position = place["queue_position"]  # type: ignore[attr-defined]
        start = place["estimated_start"]
        job.queue_title = (  # type: ignore[attr-defined]
            f"estimated start: by {start:%Y-%m-%d %H:%M} UTC"
            if start
            else f"no estimate: {place['estimate_reason']}"
        )
    _run_columns(page, timezone.now())
    return render(
        request,
        "jobs/list.html",
        {
            "jobs": page,
            "filters": filters,
            "states": JobStatus.values,
            "teams": Membership.objects.filter(user=request.user).values_list(
                "team__name", flat=True
            ),
            "backends": Cluster.Kind.values,
            "next_cursor": page[-1].pk if more else None,
            "oldest_first": oldest_first,
        },
    )


def _run_columns(page: list, now) -> None:
    """The list's Duration and GPU-hours of each job on the page, from one query for the
    attempts of all of them.

    `job.run` is a dict: `state` is "waiting" (QUEUED: `seconds` since it last entered the
    queue), "running" (an attempt is up: from the first attempt's start to now), "ran" (from
    the first attempt's start to the last attempt's end, gaps between attempts included, as a
    run's wall clock) or "none" (never started). `gpu_seconds` is what the meter bills: each
    attempt's (end, or now while up, − start) × its GPUs (`metering.usage.job_gpu_seconds`);
    `gpu_seconds_ended` leaves out the attempt that is up (`open_start`; `open_total_gpus` are
    its GPUs in all, else the job's), so the page can count it on (static/js/durations.js)."""
    attempts = defaultdict(list)
    rows = (
        Attempt.objects.filter(job_id__in=[job.pk for job in page])
        .select_related("activity")
        .only("job_id", "start_time", "end_time", "total_gpus", "activity")
    )
    for attempt in rows:
        attempts[attempt.job_id].append(attempt)
    for job in page:
        mine = attempts[job.pk]
        starts = [a.start_time for a in mine if a.start_time]
        ends = [a.end_time for a in mine if a.start_time and a.end_time]
        up = (
            next((a for a in mine if a.start_time and a.end_time is None), None)
            if job.status in JobStatus.active()
            else None
        )
        first = min(starts) if starts else None
        last = (max(ends) if ends else job.status_changed_at) if starts and up is None else None
        run: dict[str, Any] = {
            "state": "none",
            "start": first,
            "end": last,
            "since": None,
            "seconds": None,
            "gpu_seconds": job_gpu_seconds(mine, now),
            "gpu_seconds_ended": job_gpu_seconds([a for a in mine if a is not up], now),
            "open_start": up.start_time if up else None,
            "open_total_gpus": up.total_gpus if up else job.total_gpus,
            "cost": shown(job_cost(job.cluster_id, job.gpu_type, _started(mine), now)),
            "efficiency": job_efficiency(mine, now),  # active / billed GPU-seconds
        }
        if job.status == JobStatus.QUEUED:
            since = job.status_changed_at
            run.update(state="waiting", since=since, seconds=(now - since).total_seconds())
        elif up is not None and first is not None:
            run.update(state="running", seconds=(now - first).total_seconds())
        elif first is not None and last is not None:
            run.update(state="ran", seconds=(last - first).total_seconds())
        job.run = run  # type: ignore[attr-defined]


def _started(attempts: list) -> list[tuple]:
    return [(a.start_time, a.end_time, a.total_gpus) for a in attempts if a.start_time]


@login_required
def job_detail(request, job_id: int):
    job = _visible(request, job_id)
    now = timezone.now()
    rows = list(job.attempts.order_by("number"))
    costs = attempt_costs(job.cluster_id, job.gpu_type, rows, now)
    attempts = [
        {
            "a": a,
            "gpu_seconds": attempt_gpu_seconds(a.start_time, a.end_time, a.total_gpus, now),
            "cost": shown(cost.micros),
            "split": cost.split,
        }
        for a, cost in zip(rows, costs, strict=True)
    ]
    attempt = current_attempt(job)
    ranks = attempt.ranks if attempt and job.nodes > 1 else []
    people = audit.job_people(request.user, job)  # who stopped it, and how (issue 51)
    return render(
        request,
        "jobs/detail.html",
        {
            "job": job,
            "resources": _resources(job),
            "ranks": ranks,
            "rank_choices": _rank_choices(job, ranks),
            "attempts": attempts,
            "cost": shown(sum(cost.micros for cost in costs)),
            "events": audit.mark_people(job.events.order_by("pk"), people),
            "people": people,
            "diagnostics": diagnostics.explain(job, now),
            "actions": _actions(job, teams.can_control_jobs(request.user, job.team_id)),
            "follow_ons_json": json.dumps(
                [
                    {"id": pk, "name": name}
                    for pk, name in job.follow_ons.order_by("pk").values_list(
                        "pk", "follow_on_name"
                    )
                ]
            ),
            "terminal": job.status in JobStatus.terminal(),
        },
    )


def _resources(job) -> list[tuple[str, str]]:
    """What each node of the job asked for besides GPUs: (what, value) pairs."""
    out = []
    if job.cpus:
        out.append(("CPUs", str(job.cpus)))
    if job.memory_mb:
        out.append(("memory", _mib(job.memory_mb)))
    if job.image:
        out.append(("image", job.image))
    return out


def _mib(mib: int) -> str:
    """A size in MiB in the largest binary unit it reaches: 65536 is "64 GiB"."""
    for unit, size in (("TiB", 1024 * 1024), ("GiB", 1024)):
        if mib >= size:
            return f"{mib / size:.4g} {unit}"
    return f"{mib} MiB"


def _rank_choices(job, ranks: list[dict]) -> list[dict]:
    """Each rank of a multi-node job with its node, as the current attempt last reported it
    (empty before it reports): the Logs tab's rank filter and the System tab's groups."""
    if job.nodes < 2:
        return []
    nodes = {r["rank"]: r["node"] for r in ranks}
    return [{"rank": r, "node": nodes.get(r, "")} for r in range(job.nodes)]


@login_required
@require_POST
def job_action(request, job_id: int, verb: str):
    """A control button. Forms get a redirect; the page's script (fetch) gets JSON."""
    wants_json = request.headers.get("Accept", "").startswith("application/json")
    if verb not in ACTIONS:
        raise Http404(f"unknown action {verb!r}")
    try:
        job = ACTIONS[verb](request.user, job_id)
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    except Forbidden as exc:  # a viewer: the same 403 as the API, not a refused transition
        if wants_json:
            return JsonResponse({"detail": exc.detail}, status=exc.status)
        raise PermissionDenied(exc.detail) from exc
    except (ApiError, TransitionRefused) as exc:
        if wants_json:
            return JsonResponse({"detail": str(exc)}, status=409)
        messages.error(request, str(exc))
        return HttpResponseRedirect(reverse("job-detail", args=[job_id]))
    if wants_json:
        return JsonResponse({"status": job.status, "reason": job.status_reason})
    messages.success(request, f"job {job_id}: {job.status}")
    return HttpResponseRedirect(reverse("job-detail", args=[job_id]))


@never_cache  # a new token's secret is shown on this answer
@login_required
def token_list(request):
    """The user's tokens and a form to create one; a new secret is shown on this answer only."""
    created, secret, form = None, "", {"name": "", "expires_in_days": ""}
    if request.method == "POST":
        form = {k: request.POST.get(k, "").strip() for k in form}
        days = form["expires_in_days"]
        try:
            if days and not days.isdigit():
                raise BadRequest(f"expiry must be a whole number of days, got {days!r}")
            created, secret = tokens.create_token(
                request.user, form["name"], int(days) if days else None
            )
        except ApiError as exc:
            messages.error(request, exc.detail)
    return render(
        request,
        "jobs/tokens.html",
        {
            "tokens": user_tokens(request.user),
            "created": created,
            "secret": secret,
            "form": form if created is None else {"name": "", "expires_in_days": ""},
            "now": timezone.now(),
            "expires_max": tokens.EXPIRES_IN_DAYS_MAX,
        },
    )


@login_required
@require_POST
def token_revoke(request, token_id: int):
    try:
        row = tokens.revoke_token(request.user, token_id)
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    messages.success(request, f"token {row.name} ({row.prefix}…) revoked")
    return HttpResponseRedirect(reverse("tokens"))


def states_help(request):
    verbs = [
        {
            "name": verb.name,
            "target": verb.target or "(the job is deleted)",
            "allowed_from": [s for s in JobStatus.values if s in verb.allowed_from],
        }
        for verb in VERBS.values()
    ]
    return render(request, "jobs/states.html", {"states": JobStatus.values, "verbs": verbs})


def _visible(request, job_id: int):
    try:
        return get_visible_job(request.user, job_id)
    except NotFound as exc:
        raise Http404(exc.detail) from exc


def _actions(job, can_control: bool) -> list[dict]:
    """The control buttons: shown where `VERBS` allows the verb, disabled with a reason."""
    shown = []
    for verb in ACTIONS:
        if job.status not in VERBS[verb].allowed_from:
            continue
        why_not = retry_unavailable_reason(job) if verb == "retry" else ""
        if not can_control:
            why_not = f"your role in team {job.team.name} is viewer: you can read this job only"
        shown.append({"verb": verb, "disabled": bool(why_not), "why_not": why_not})
    return shown
