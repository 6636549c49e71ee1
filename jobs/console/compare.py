"""The console's compare page: several jobs' metrics overlaid, one chart per metric, with a table
of their final and best values and the parameters in which they differ.

`/compare/?jobs=12,13,14` (2 to `MAX_JOBS` ids, shareable; `&x=time` for the time axis). Every
job is checked against the viewer's teams in one query: if any of them is not visible (another
team's or missing) the whole page is a 404 that does not say which. The series are
`jobs.stores.metrics.charts.series`, the Charts tab's own read (same LTTB downsampling and the
same `DEFAULT_MAX_POINTS`), so a job's line here is the line its Charts tab draws.

Queries: one for the jobs, one for which jobs logged which kinds (and their first timestamps),
one `latest_of` per kind for all jobs, and `series`' few per job and kind that has metrics; none
per metric or per point.
"""

import shlex
from collections.abc import Iterable
from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import Min
from django.http import Http404
from django.shortcuts import render
from django.views.decorators.http import require_GET

from jobs.errors import BadRequest
from jobs.models import BIGINT_MAX, Job, MetricKind, MetricSeries
from jobs.reads.mlflow import job_params
from jobs.reads.visible import visible_jobs
from jobs.stores.metrics.charts import DEFAULT_MAX_POINTS, latest_of, series

MAX_JOBS = 20
# The Charts and Validation tabs' kinds (system is per machine).
KINDS = (MetricKind.TRAIN, MetricKind.VALIDATION)
X_AXES = {"step": "step", "time": "seconds since the job's first point"}
# Names whose best value is their lowest; every other metric's best is its highest.
LOWER_IS_BETTER = ("loss", "error")
# Env keys whose values are not shown (only whether jobs share them): env is not shown anywhere
# else in the console, and these names usually hold credentials.
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "AUTH")
UNSET = None  # a parameter a job does not have


def parse_ids(text: str) -> list[int]:
    """The job ids of `?jobs=`, in their order; BadRequest with a sentence for a bad list."""
    parts = [p.strip() for p in text.split(",")] if text.strip() else []
    if not parts:
        raise BadRequest(
            f"Name the jobs to compare as ?jobs=12,13 (2 to {MAX_JOBS} job ids, comma-separated)."
        )
    if "" in parts:
        raise BadRequest("The list of jobs has an empty entry: separate job ids by single commas.")
    bad = next((p for p in parts if not (p.isascii() and p.isdigit())), None)
    if bad is not None:
        shown = bad if len(bad) <= 20 else bad[:20] + "…"
        raise BadRequest(f"“{shown}” is not a job id: list whole numbers separated by commas.")
    ids = [int(p) for p in parts]
    if len(set(ids)) != len(ids):
        twice = next(i for i in ids if ids.count(i) > 1)
        raise BadRequest(f"Job {twice} is listed twice: name each job once.")
    if len(ids) < 2:
        raise BadRequest("Compare needs at least 2 jobs: add another id to ?jobs=.")
    if len(ids) > MAX_JOBS:
        raise BadRequest(f"Compare shows at most {MAX_JOBS} jobs at once; {len(ids)} were listed.")
    return ids


def lower_is_better(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in LOWER_IS_BETTER)


def _secret(key: str) -> bool:
    upper = key.upper()
    return any(word in upper for word in SECRET_WORDS)


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return shlex.join(str(v) for v in value)
    if isinstance(value, str):
        return value
    return str(value)


def differing_parameters(jobs: list[Job]) -> tuple[list[dict], int]:
    """The rows of the "parameters that differ" table and how many parameters are the same.

    A parameter is the entrypoint, an env key, an array parameter key or an MLflow param its
    code logged (its latest attempt's that logged any, `jobs.reads.mlflow.job_params`); a job
    without the key has it unset (shown as "—"). A row lists every job's value, in the jobs'
    order. Env keys that look like credentials (`SECRET_WORDS`) show which jobs share a value,
    not the value.
    """
    params: list[tuple[str, str, list[Any]]] = [
        ("entrypoint", "entrypoint", [list(j.entrypoint or []) for j in jobs])
    ]
    for key in sorted(set().union(*((j.env or {}).keys() for j in jobs))):
        params.append(("env", key, [(j.env or {}).get(key, UNSET) for j in jobs]))
    array_keys: Iterable[str] = set().union(*((j.array_params or {}).keys() for j in jobs))
    for key in sorted(array_keys):
        params.append(("array", key, [(j.array_params or {}).get(key, UNSET) for j in jobs]))
    logged = job_params(j.pk for j in jobs)
    for key in sorted(set().union(*(logged.get(j.pk, {}).keys() for j in jobs))):
        params.append(("mlflow", key, [logged.get(j.pk, {}).get(key, UNSET) for j in jobs]))
    rows, same = [], 0
    for where, key, values in params:
        if all(v == values[0] for v in values[1:]):
            same += 1
            continue
        hidden = where == "env" and _secret(key)
        distinct: list[Any] = []
        cells = []
        for value in values:
            if value is UNSET:
                cells.append({"unset": True, "text": "—"})
                continue
            if hidden:
                if value not in distinct:
                    distinct.append(value)
                cells.append({"unset": False, "text": f"hidden value {distinct.index(value) + 1}"})
            else:
                cells.append({"unset": False, "text": _shown(value)})
        label = {
            "entrypoint": "entrypoint",
            "env": f"env {key}",
            "array": f"array param {key}",
            "mlflow": f"mlflow param {key}",
        }
        rows.append({"label": label[where], "cells": cells, "hidden": hidden})
    return rows, same


def _number(value: float) -> str:
    return f"{value:.6g}"


def _logged(job_ids: list[int]) -> tuple[set[tuple[int, str]], dict[int, float]]:
    """Which kinds each job logged (the series reads to make) and its earliest point's time
    (where its time axis starts), in one grouped query."""
    found = (
        MetricSeries.objects.filter(job_id__in=job_ids, kind__in=KINDS, count__gt=0)
        .order_by()
        .values_list("job_id", "kind")
        .annotate(first=Min("min_ts"))
    )
    kinds: set[tuple[int, str]] = set()
    start: dict[int, float] = {}
    for job_id, kind, first in found:
        kinds.add((job_id, kind))
        if first is not None:
            start[job_id] = min(first, start.get(job_id, first))
    return kinds, start


def overlay(jobs: list[Job], x: str) -> dict[str, Any]:
    """Per kind, per metric name: one trace per job that logged it, plus each job's final and
    best value. Jobs keep the order they were listed in; metric names sort."""
    ids = [j.pk for j in jobs]
    logged, starts = _logged(ids)
    latest = {kind: latest_of(ids, kind) for kind in KINDS}
    charts: dict[str, dict[str, list[dict]]] = {kind: {} for kind in KINDS}
    values: dict[tuple[str, str], dict[int, dict]] = {}
    for kind in KINDS:
        for job in jobs:
            if (job.pk, kind) not in logged:
                continue
            start = starts.get(job.pk, 0.0)
            for name, s in series(job.pk, kind, x, DEFAULT_MAX_POINTS).items():
                xs = s["x"] if x == "step" else [round(t - start, 3) for t in s["x"]]
                charts[kind].setdefault(name, []).append(
                    {
                        "job": job.pk,
                        "name": f"job {job.pk} · {job.name}" if job.name else f"job {job.pk}",
                        "x": xs,
                        "y": s["y"],
                        "total": s["total"],
                        "downsampled": s["downsampled"],
                    }
                )
                # The downsampled series keeps the lowest and highest points (keep_extremes):
                # its extremes are the whole series'.
                ys = s["y"]
                best = min(ys) if lower_is_better(name) else max(ys)
                final = latest[kind].get(job.pk, {}).get(name)
                values.setdefault((kind, name), {})[job.pk] = {
                    "final": final["value"] if final else None,
                    "final_text": _number(final["value"]) if final else "—",
                    "final_step": final["step"] if final else None,
                    "best": best,
                    "best_text": _number(best),
                }
    columns = [
        {
            "kind": kind,
            "name": name,
            "label": name if kind == "train" else f"{name} (validation)",
            "rule": "min" if lower_is_better(name) else "max",
        }
        for kind in KINDS
        for name in sorted(charts[kind])
    ]
    table = [
        {
            "job": job,
            "values": [values[(c["kind"], c["name"])].get(job.pk) for c in columns],
        }
        for job in jobs
    ]
    data = {
        "x": x,
        "x_title": X_AXES[x],
        "charts": [
            {
                "kind": c["kind"],
                "name": c["name"],
                "title": c["label"],
                "traces": charts[c["kind"]][c["name"]],
            }
            for c in columns
        ],
    }
    return {"data": data, "columns": columns, "table": table}


def _refused(request, sentence: str):
    return render(request, "jobs/compare.html", {"error": sentence}, status=400)


@login_required
@require_GET
def compare(request):
    try:
        # ?jobs=12,13 (shareable), or ?jobs=12&jobs=13 from the jobs list's form without scripts
        ids = parse_ids(",".join(request.GET.getlist("jobs")))
    except BadRequest as exc:
        return _refused(request, exc.detail)
    x = request.GET.get("x", "step")
    if x not in X_AXES:
        return _refused(request, "The x axis is step or time (?x=step or ?x=time).")
    too_large = max(ids) > BIGINT_MAX  # no job has it (and SQLite cannot bind it)
    found = {} if too_large else {j.pk: j for j in visible_jobs(request.user).filter(pk__in=ids)}
    if len(found) != len(ids):
        # Not which one: a missing job and another team's read the same.
        raise Http404("one or more of these jobs do not exist or belong to a team you are not in")
    jobs = [found[i] for i in ids]
    shown = overlay(jobs, x)
    rows, same = differing_parameters(jobs)
    query = ",".join(str(i) for i in ids)
    return render(
        request,
        "jobs/compare.html",
        {
            "jobs": jobs,
            "ids": query,
            "x": x,
            "x_axes": X_AXES,
            "chart_data": shown["data"],
            "columns": shown["columns"],
            "table": shown["table"],
            "differing": rows,
            "same_count": same,
            "lower_words": " or ".join(f"“{w}”" for w in LOWER_IS_BETTER),
        },
    )
