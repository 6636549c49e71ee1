"""The compare page (`/compare/?jobs=…`): the jobs' metrics overlaid per chart with the Charts
tab's downsampling, their final and best values, the parameters in which they differ, and every
job checked against the viewer's teams."""

import html
import json
import re
import time

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from jobs.console.compare import MAX_JOBS
from jobs.models import Job, JobArray
from jobs.states import JobStatus
from jobs.stores.metrics.charts import DEFAULT_MAX_POINTS, series
from jobs.stores.metrics.ingest import append
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
NOW = time.time()


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def logged(job: Job, points: list[tuple[str, str, int, float]], dt: float = 1.0) -> None:
    """Store (kind, name, step, value) points for the job's first attempt, made here; point i
    is logged at NOW + i * dt."""
    if not job.attempt_count:
        with_attempt(job, JobStatus.SUCCEEDED)
        job.refresh_from_db()
    append(
        job.pk,
        1,
        [
            {"seq": i, "kind": kind, "name": name, "step": step, "value": value, "ts": NOW + i * dt}
            for i, (kind, name, step, value) in enumerate(points)
        ],
    )


def chart_data(response) -> dict:
    found = re.search(
        r'<script id="compare-data" type="application/json">(.*?)</script>',
        response.content.decode(),
        re.S,
    )
    assert found, response.content.decode()[:2000]
    return json.loads(found.group(1))


def text(response) -> str:
    return html.unescape(response.content.decode())


def compare(client: Client, *jobs: Job, **params):
    return client.get("/compare/", {"jobs": ",".join(str(j.pk) for j in jobs), **params})


@pytest.fixture
def two(team, alice) -> tuple[Job, Job]:
    """Two of alice's jobs: a loss going down and an accuracy going up, one validation metric
    logged by the first only."""
    a = queued_job(team, alice, name="lr-high")
    b = queued_job(team, alice, name="lr-low")
    logged(
        a,
        [
            ("train", "loss", 0, 2.0),
            ("train", "loss", 1, 0.5),
            ("train", "loss", 2, 1.0),  # final 1.0, best (min) 0.5
            ("train", "accuracy", 0, 0.3),
            ("train", "accuracy", 1, 0.9),
            ("train", "accuracy", 2, 0.7),  # final 0.7, best (max) 0.9
            ("validation", "val_error", 2, 0.25),
        ],
    )
    logged(
        b,
        [
            ("train", "loss", 0, 3.0),
            ("train", "loss", 1, 2.5),  # final 2.5, best 2.5
            ("train", "accuracy", 0, 0.1),
            ("train", "accuracy", 1, 0.2),  # final 0.2, best 0.2
        ],
    )
    return a, b


# -- the charts ----------------------------------------------------------------------------------


def test_each_metric_is_one_chart_with_one_trace_per_job_that_logged_it(alice, two):
    a, b = two
    page = compare(signed_in(alice), a, b)
    assert page.status_code == 200
    data = chart_data(page)
    charts = {(c["kind"], c["name"]): c for c in data["charts"]}
    assert list(charts) == [("train", "accuracy"), ("train", "loss"), ("validation", "val_error")]
    loss = charts[("train", "loss")]["traces"]
    assert [t["name"] for t in loss] == [f"job {a.pk} · lr-high", f"job {b.pk} · lr-low"]
    assert [(t["x"], t["y"]) for t in loss] == [([0, 1, 2], [2.0, 0.5, 1.0]), ([0, 1], [3.0, 2.5])]
    assert [t["job"] for t in charts[("validation", "val_error")]["traces"]] == [a.pk]
    assert charts[("validation", "val_error")]["title"] == "val_error (validation)"
    assert data["x"] == "step"
    assert "vendor/plotly.min.js" in page.content.decode()
    assert "js/compare.js" in page.content.decode()


def test_the_jobs_keep_the_order_they_are_listed_in(alice, two):
    a, b = two
    loss = chart_data(compare(signed_in(alice), b, a))["charts"][1]
    assert loss["name"] == "loss" and [t["job"] for t in loss["traces"]] == [b.pk, a.pk]


def test_a_long_series_is_downsampled_as_the_charts_tab_does(team, alice):
    a, b = queued_job(team, alice, name="long"), queued_job(team, alice, name="short")
    n = DEFAULT_MAX_POINTS * 3
    logged(a, [("train", "loss", i, 1.0 / (i + 1) + (i % 7) * 0.01) for i in range(n)])
    logged(b, [("train", "loss", 0, 1.0)])
    trace = chart_data(compare(signed_in(alice), a, b))["charts"][0]["traces"][0]
    tab = series(a.pk, "train", "step")["loss"]  # what /api/v1/jobs/ID/metrics answers
    assert len(trace["y"]) == DEFAULT_MAX_POINTS < n
    assert (trace["x"], trace["y"]) == (tab["x"], tab["y"])
    assert trace["total"] == n and trace["downsampled"] is True


def test_the_time_axis_is_seconds_since_each_jobs_first_point(alice, two):
    a, b = two
    page = compare(signed_in(alice), a, b, x="time")
    data = chart_data(page)
    assert data["x"] == "time" and "since the job" in data["x_title"]
    loss = data["charts"][1]["traces"]
    # a logged its loss as points 0..2 (1 s apart); b's loss as points 0 and 1
    assert [t["x"] for t in loss] == [[0.0, 1.0, 2.0], [0.0, 1.0]]
    assert '<option value="time" selected>' in page.content.decode()


def test_jobs_without_metrics_say_so(team, alice):
    a, b = queued_job(team, alice), queued_job(team, alice)
    page = compare(signed_in(alice), a, b)
    assert page.status_code == 200 and chart_data(page)["charts"] == []
    assert "None of these jobs has logged training or validation metrics yet." in text(page)


# -- the values table ----------------------------------------------------------------------------


def test_final_and_best_values_take_min_for_losses_and_max_otherwise(alice, two):
    a, b = two
    page = compare(signed_in(alice), a, b)
    columns = [(c["kind"], c["name"], c["rule"]) for c in page.context["columns"]]
    assert columns == [
        ("train", "accuracy", "max"),
        ("train", "loss", "min"),
        ("validation", "val_error", "min"),
    ]
    table = {row["job"].pk: row["values"] for row in page.context["table"]}
    pick = {pk: [(v["final"], v["best"]) if v else None for v in vs] for pk, vs in table.items()}
    assert pick == {
        a.pk: [(0.7, 0.9), (1.0, 0.5), (0.25, 0.25)],
        b.pk: [(0.2, 0.2), (2.5, 2.5), None],
    }
    shown = text(page)
    row_a = re.search(rf'<tr data-job-id="{a.pk}">(.*?)</tr>', shown, re.S).group(1)
    cells = re.findall(r'<td class="mono num (final|best)"[^>]*>([^<]*)</td>', row_a)
    assert cells == [
        ("final", "0.7"),
        ("best", "0.9"),
        ("final", "1"),
        ("best", "0.5"),
        ("final", "0.25"),
        ("best", "0.25"),
    ]
    row_b = re.search(rf'<tr data-job-id="{b.pk}">(.*?)</tr>', shown, re.S).group(1)
    assert row_b.count(">—</td>") == 2  # b logged no val_error
    assert f'href="/jobs/{a.pk}/"' in row_a and "lr-high" in row_a and "SUCCEEDED" in row_a
    assert "the lowest value for metrics whose name contains “loss” or “error”" in shown
    assert "the highest for every other metric" in shown


def test_best_is_the_extreme_of_the_whole_series_even_when_downsampled(team, alice):
    a, b = queued_job(team, alice), queued_job(team, alice)
    n = DEFAULT_MAX_POINTS * 3
    spike, dip = 1234, 4321
    points = [("train", "loss", i, 5.0 + (i % 5) * 0.1) for i in range(n)]
    points[dip] = ("train", "loss", dip, 0.001)
    logged(a, points + [("train", "score", i, 1.0 if i != spike else 99.0) for i in range(n)])
    logged(b, [("train", "loss", 0, 1.0)])
    values = compare(signed_in(alice), a, b).context["table"][0]["values"]
    assert [v["best"] for v in values] == [0.001, 99.0]
    assert [v["final"] for v in values] == [5.0 + ((n - 1) % 5) * 0.1, 1.0]


# -- the parameters that differ ------------------------------------------------------------------


def test_differing_parameters_are_shown_side_by_side_and_the_same_ones_counted(team, alice):
    a = queued_job(
        team,
        alice,
        entrypoint=["python", "train.py", "--lr", "0.1"],
        env={"SEED": "1", "LR": "0.1", "ONLY_A": "yes", "WANDB_API_KEY": "k-aaaa-secret"},
    )
    b = queued_job(
        team,
        alice,
        entrypoint=["python", "train.py", "--lr", "0.01"],
        env={"SEED": "1", "LR": "0.01", "WANDB_API_KEY": "k-bbbb-secret"},
    )
    page = compare(signed_in(alice), a, b)
    rows = {r["label"]: [c["text"] for c in r["cells"]] for r in page.context["differing"]}
    assert rows == {
        "entrypoint": ["python train.py --lr 0.1", "python train.py --lr 0.01"],
        "env LR": ["0.1", "0.01"],
        "env ONLY_A": ["yes", "—"],
        "env WANDB_API_KEY": ["hidden value 1", "hidden value 2"],
    }
    shown = text(page)
    table = re.search(r'<table id="compare-params">(.*?)</table>', shown, re.S).group(1)
    assert "env LR" in table and "0.01" in table and "python train.py --lr 0.1" in table
    assert "SEED" not in table
    assert "1 parameter is the same for all" in shown
    assert "k-aaaa-secret" not in shown and "k-bbbb-secret" not in shown


def test_a_shared_secret_reads_as_the_same_hidden_value(team, alice):
    env_a = {"HF_TOKEN": "same", "OTHER_TOKEN": "x1"}
    env_b = {"HF_TOKEN": "same", "OTHER_TOKEN": "x2"}
    c_env = {"HF_TOKEN": "diff", "OTHER_TOKEN": "x1"}
    jobs = [queued_job(team, alice, env=e) for e in (env_a, env_b, c_env)]
    rows = {
        r["label"]: [c["text"] for c in r["cells"]]
        for r in compare(signed_in(alice), *jobs).context["differing"]
    }
    assert rows == {
        "env HF_TOKEN": ["hidden value 1", "hidden value 1", "hidden value 2"],
        "env OTHER_TOKEN": ["hidden value 1", "hidden value 2", "hidden value 1"],
    }


def test_array_params_that_differ_are_rows_and_an_array_links_its_first_20_tasks(team, alice):
    array = JobArray.objects.create(team=team, user=alice, name="sweep", spec="0-21", size=22)
    tasks = [
        queued_job(
            team,
            alice,
            name=f"sweep[{i}]",
            array=array,
            array_index=i,
            array_params={"lr": [0.1, 0.01][i % 2], "batch": 32},
        )
        for i in range(22)
    ]
    array_page = signed_in(alice).get(f"/arrays/{array.pk}/").content.decode()
    link = re.search(r'<a id="array-compare" href="([^"]+)">Compare these tasks</a>', array_page)
    assert link, array_page
    assert link.group(1) == "/compare/?jobs=" + ",".join(str(t.pk) for t in tasks[:20])
    page = signed_in(alice).get(html.unescape(link.group(1)))
    assert page.status_code == 200
    rows = {r["label"]: [c["text"] for c in r["cells"]] for r in page.context["differing"]}
    assert rows == {"array param lr": ["0.1", "0.01"] * 10}
    assert "2 parameters are the same for all" in text(page)  # entrypoint and batch


def test_identical_jobs_have_no_differing_parameters(team, alice):
    a, b = queued_job(team, alice, env={"A": "1"}), queued_job(team, alice, env={"A": "1"})
    shown = text(compare(signed_in(alice), a, b))
    assert "No differences in entrypoint, env or array parameters." in shown
    assert "2 parameters are the same for all" in shown


# -- who sees what, and bad lists ----------------------------------------------------------------


def test_another_teams_job_makes_the_whole_page_a_404_that_says_not_which(
    team, alice, make_team, make_user, two
):
    a, _ = two
    nlp = make_team("nlp")
    theirs = queued_job(nlp, make_user("bob", nlp), name="bobs-secret-run")
    logged(theirs, [("train", "bobs_metric", 0, 1.0)])
    client = signed_in(alice)
    foreign = compare(client, a, theirs)
    assert foreign.status_code == 404
    assert "bobs-secret-run" not in text(foreign) and "bobs_metric" not in text(foreign)
    missing = client.get("/compare/", {"jobs": f"{a.pk},{theirs.pk + 1000}"})
    assert missing.status_code == 404
    assert missing.content == foreign.content  # a missing job and another team's read the same
    assert compare(signed_in(Job.objects.get(pk=theirs.pk).user), a, theirs).status_code == 404


def test_the_page_needs_a_signed_in_user(two):
    a, b = two
    answer = compare(Client(), a, b)
    assert answer.status_code == 302 and answer.url.startswith("/accounts/login/")


@pytest.mark.parametrize(
    ("jobs", "sentence"),
    [
        ("", "Name the jobs to compare as ?jobs=12,13 (2 to 20 job ids, comma-separated)."),
        ("7", "Compare needs at least 2 jobs: add another id to ?jobs=."),
        ("7,x", "“x” is not a job id: list whole numbers separated by commas."),
        ("7,-8", "“-8” is not a job id"),
        ("7,8.5", "“8.5” is not a job id"),
        ("7,,8", "The list of jobs has an empty entry: separate job ids by single commas."),
        ("7,8,7", "Job 7 is listed twice: name each job once."),
        (",".join(map(str, range(1, MAX_JOBS + 2))), "at most 20 jobs at once; 21 were listed."),
    ],
)
def test_a_malformed_list_is_a_400_with_a_sentence(alice, jobs, sentence):
    answer = signed_in(alice).get("/compare/", {"jobs": jobs})
    assert answer.status_code == 400
    assert sentence in text(answer)
    assert 'id="compare-data"' not in answer.content.decode()


def test_one_job_is_a_400(alice, two):
    a, _ = two
    answer = compare(signed_in(alice), a)
    assert answer.status_code == 400 and "at least 2 jobs" in text(answer)


def test_an_unknown_x_axis_is_a_400(alice, two):
    answer = compare(signed_in(alice), *two, x="epoch")
    assert answer.status_code == 400 and "The x axis is step or time" in text(answer)


def test_the_lists_form_without_scripts_sends_repeated_ids_which_the_page_reads(alice, two):
    a, b = two
    answer = signed_in(alice).get("/compare/", {"jobs": [str(a.pk), str(b.pk)]})
    assert answer.status_code == 200 and len(chart_data(answer)["charts"]) == 3


def test_the_jobs_list_has_a_checkbox_per_row_and_a_compare_button(team, alice, two):
    a, b = two
    page = signed_in(alice).get("/").content.decode()
    form = re.search(
        r'<form id="compare-form"[^>]*action="/compare/"[^>]*>(.*?)</form>', page, re.S
    )
    assert form and "Compare selected" in form.group(1)
    boxes = re.findall(
        r'<input type="checkbox" class="compare-pick" name="jobs" value="(\d+)"', page
    )
    assert sorted(map(int, boxes)) == sorted([a.pk, b.pk])
    assert f'aria-label="select job {a.pk} to compare"' in page and 'form="compare-form"' in page
    assert "js/compare.js" in page


# -- bounded queries -----------------------------------------------------------------------------


def _queries(client: Client, jobs: list[Job]) -> int:
    with CaptureQueriesContext(connection) as seen:
        assert compare(client, *jobs).status_code == 200
    return len(seen)


def test_queries_do_not_grow_with_metrics_or_points_and_little_with_jobs(team, alice):
    def made(metric_count: int, points: int) -> Job:
        job = queued_job(team, alice)
        logged(
            job,
            [
                ("train", f"m{m}", step, float(step))
                for m in range(metric_count)
                for step in range(points)
            ]
            + [("validation", "val_loss", 0, 1.0)],
        )
        return job

    client = signed_in(alice)
    small = [made(1, 2) for _ in range(2)]
    wide = [made(8, 50) for _ in range(2)]
    many = [made(2, 5) for _ in range(8)]
    two_jobs = _queries(client, small)
    assert _queries(client, wide) == two_jobs  # 8 metrics of 50 points: not one query more
    eight_jobs = _queries(client, many)
    # The series reads are per job and kind (the Charts tab's own read), a couple of queries
    # each; nothing is per metric or per point.
    assert eight_jobs - two_jobs <= 6 * 2 * 2, (two_jobs, eight_jobs)


def test_an_id_too_large_for_any_job_is_a_404_not_an_error(alice, two):
    a, _ = two
    answer = signed_in(alice).get("/compare/", {"jobs": f"{a.pk},{10**30}"})
    assert answer.status_code == 404
