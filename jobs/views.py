"""A first server-rendered console: the jobs list and a job page, read from the ledger."""

import json

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render

from jobs import logstore, services
from jobs.errors import NotFound
from jobs.states import JobStatus


@login_required
def job_list(request):
    jobs = (
        services.visible_jobs(request.user)
        .select_related("team", "user", "cluster")
        .order_by("-pk")[:100]
    )
    return render(request, "jobs/list.html", {"jobs": jobs, "states": JobStatus.values})


@login_required
def job_detail(request, job_id: int):
    try:
        job = services.get_visible_job(request.user, job_id)
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    page = logstore.tail(job.pk, 200)
    return render(
        request,
        "jobs/detail.html",
        {
            "job": job,
            "events": job.events.order_by("pk"),
            "attempts": job.attempts.order_by("number"),
            "log_lines": [json.loads(line)["text"] for line in page.raw_lines],
        },
    )
