"""The console's array page: an array's counts per state and its tasks as a table, each with
its parameters, status and latest metric values, and the verbs for the whole array (the same
`jobs.actions.arrays.act` as `POST /api/v1/arrays/{id}/{verb}`)."""

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from jobs.actions import arrays as array_actions
from jobs.console import refusals
from jobs.errors import NotFound
from jobs.reads import arrays, teams


@login_required
def array_detail(request, array_id: int):
    try:
        array = arrays.get_visible_array(request.user, array_id)
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    names, rows = arrays.task_rows(array)
    for row in rows:  # the page's cells, in the order of its metric columns
        row["values"] = [row["latest"].get(name) for name in names]
    by_state = arrays.counts([array.pk])[array.pk]
    return render(
        request,
        "jobs/array.html",
        {
            "array": array,
            "counts": by_state,
            "summary": arrays.summary(by_state),
            "metric_names": names,
            "rows": rows,
            "shown": len(rows),
            "can_control": teams.can_control_jobs(request.user, array.team_id),
            "verbs": array_actions.ARRAY_VERBS,
        },
    )


@login_required
@require_POST
def array_action(request, array_id: int, verb: str):
    if verb not in array_actions.ARRAY_VERBS:
        raise Http404(f"no verb {verb}")

    def run() -> str:
        failed = request.POST.get("failed") == "1"
        done = array_actions.act(request.user, array_id, verb, failed_only=failed)
        return f"{verb}: {done['acted']} task(s) moved, {done['left']} left as they were"

    return refusals.act(request, run, reverse("array-detail", args=[array_id]))
