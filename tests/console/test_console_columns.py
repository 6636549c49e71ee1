"""The jobs list's Duration and GPU-hours columns, absolute times on hover, and the job page's
keyboard tabs, as the server renders them (the browser side: tests/browser/
test_console_finish_browser.py)."""

import datetime as dt
import re
from html.parser import HTMLParser

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import Job
from jobs.templatetags.console import elapsed, gpu_hours, utc, utc_time
from metering.prices import forget_prices
from tests.factories import place, queued_job, with_attempt

pytestmark = pytest.mark.django_db
HOUR = dt.timedelta(hours=1)


class Rows(HTMLParser):
    """Each list row's cells by class: {job id: {class: (attributes, text)}}."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[int, dict[str, tuple[dict, str]]] = {}
        self.row: int | None = None
        self.cell: tuple[str, dict] | None = None
        self.text = ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and "data-job-id" in attrs:
            self.row = int(attrs["data-job-id"])
            self.rows[self.row] = {}
        elif tag == "td" and self.row is not None:
            self.cell, self.text = ((attrs.get("class") or "").split(" ")[0], attrs), ""

    def handle_data(self, data):
        if self.cell:
            self.text += data

    def handle_endtag(self, tag):
        if tag == "td" and self.cell and self.row is not None:
            name, attrs = self.cell
            self.rows[self.row][name] = (attrs, self.text.strip())
            self.cell = None
        elif tag == "tr":
            self.row = None


def list_rows(client: Client, path: str = "/") -> dict[int, dict[str, tuple[dict, str]]]:
    response = client.get(path)
    assert response.status_code == 200
    parser = Rows()
    parser.feed(response.content.decode())
    return parser.rows


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def finished_job(team, user, now):
    """Two attempts on 2 GPUs: 3 h to 2 h ago, then 90 min to 30 min ago (a pause between)."""
    job = queued_job(team, user, total_gpus=2, name="finished")
    with_attempt(job, "PAUSED", start_time=now - 3 * HOUR, end_time=now - 2 * HOUR)
    with_attempt(job, "SUCCEEDED", start_time=now - 1.5 * HOUR, end_time=now - 0.5 * HOUR)
    return Job.objects.get(pk=job.pk)


def running_job(team, user, now):
    job = queued_job(team, user, total_gpus=1, name="running")
    with_attempt(job, "RUNNING", start_time=now - HOUR)
    return job


def waiting_job(team, user, now):
    job = queued_job(team, user, name="waiting")
    Job.objects.filter(pk=job.pk).update(status_changed_at=now - dt.timedelta(minutes=5))
    return job


def test_a_finished_job_shows_first_start_to_last_end_and_the_gpu_hours_of_all_attempts(
    team, alice
):
    now = timezone.now()
    job = finished_job(team, alice, now)
    duration, hours = (list_rows(signed_in(alice))[job.pk][c] for c in ("duration", "gpu-hours"))
    assert duration[1] == "02:30:00"  # wall clock: the pause between the attempts included
    assert duration[0]["data-state"] == "ran"
    assert duration[0]["title"] == f"{utc(now - 3 * HOUR)} → {utc(now - 0.5 * HOUR)}"
    assert hours[1] == "4.00"  # (1 h + 1 h) x 2 GPUs
    assert hours[0]["title"] == "14400.0 GPU-seconds"
    assert "data-open-start" not in hours[0]


def test_a_running_job_counts_to_now_and_the_page_gets_what_to_count_on_from(team, alice):
    now = timezone.now()
    job = running_job(team, alice, now)
    duration, hours = (list_rows(signed_in(alice))[job.pk][c] for c in ("duration", "gpu-hours"))
    assert re.fullmatch(r"01:00:0\d", duration[1]), duration
    assert duration[0]["data-state"] == "running"
    assert "data-end" not in duration[0]
    assert re.fullmatch(r"1\.00", hours[1]), hours  # 1 GPU for an hour
    # The running attempt is left out of data-gpu-seconds: durations.js adds it on.
    assert float(hours[0]["data-gpu-seconds"]) == 0.0
    assert hours[0]["data-open-start"] and hours[0]["data-total-gpus"] == "1"


def test_a_queued_job_shows_the_time_it_has_waited_and_no_gpu_hours(team, alice):
    now = timezone.now()
    job = waiting_job(team, alice, now)
    duration, hours = (list_rows(signed_in(alice))[job.pk][c] for c in ("duration", "gpu-hours"))
    assert re.fullmatch(r"waiting 00:05:0\d", duration[1]), duration
    assert duration[0]["data-state"] == "waiting"
    assert duration[0]["title"].startswith("waiting in the queue since ")
    assert hours[1] == "—"


def test_a_requeued_job_waits_again_but_keeps_its_metered_gpu_hours(team, alice):
    now = timezone.now()
    job = finished_job(team, alice, now)
    place(job, "QUEUED")  # resumed after its pause
    Job.objects.filter(pk=job.pk).update(status_changed_at=now - dt.timedelta(seconds=30))
    duration, hours = (list_rows(signed_in(alice))[job.pk][c] for c in ("duration", "gpu-hours"))
    assert re.fullmatch(r"waiting 00:00:3\d", duration[1]), duration
    assert duration[0]["data-end"]  # what the page shows once it is launched again
    assert hours[1] == "4.00"


def test_a_job_not_started_yet_shows_a_dash(team, alice):
    job = queued_job(team, alice, name="launching")
    with_attempt(job, "PENDING", pending_at=timezone.now())
    duration, hours = (list_rows(signed_in(alice))[job.pk][c] for c in ("duration", "gpu-hours"))
    assert (duration[1], hours[1]) == ("—", "—")
    assert duration[0]["data-state"] == "none"


def _list_queries(client: Client) -> int:
    forget_prices()  # each count reads the prices once, not from the last count's cache
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/").status_code == 200
    return len(queries)


def test_the_columns_cost_the_same_queries_for_one_job_or_many(team, alice):
    now = timezone.now()
    client = signed_in(alice)
    for make in (finished_job, running_job, waiting_job):
        make(team, alice, now)
    few = _list_queries(client)
    for _ in range(6):
        for make in (finished_job, running_job, waiting_job):
            make(team, alice, now)
    rows = list_rows(client)
    assert len(rows) == 21 and all(r["gpu-hours"][1] for r in rows.values())
    assert _list_queries(client) == few


def test_time_filters_write_iso_and_the_absolute_utc_time_on_hover():
    moment = dt.datetime(2026, 12, 3, 9, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert utc_time(moment) == (
        '<time datetime="2026-12-03T08:00:00+00:00" title="2026-12-03 08:00:00 UTC">'
        "2026-12-03 08:00:00 UTC</time>"
    )
    assert utc_time(None) == "" and utc(None) == ""
    assert utc("2026-12-03T08:00:00.5+00:00") == "2026-12-03 08:00:00 UTC"
    assert [elapsed(s) for s in (None, 0, 59.9, 3600, 90061)] == [
        "—",
        "00:00:00",
        "00:00:59",
        "01:00:00",
        "1-01:01:01",
    ]
    assert [gpu_hours(s) for s in (0, 18, 3600, 14400)] == ["0.000", "0.005", "1.00", "4.00"]


def test_every_time_on_the_list_and_the_job_page_has_its_utc_time_as_title(team, alice):
    now = timezone.now()
    job = finished_job(team, alice, now)
    client = signed_in(alice)
    for path in ("/", f"/jobs/{job.pk}/"):
        page = client.get(path).content.decode()
        times = re.findall(r"<time [^>]*>", page)
        assert times, path
        for tag in times:
            assert re.search(r'title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"', tag), tag
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f'title="{utc(now - 3 * HOUR)}"' in page  # the first attempt's start, Events tab


def test_job_page_tabs_are_an_aria_tablist_with_one_tab_in_the_tab_order(team, alice):
    job = queued_job(team, alice)
    page = signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert 'role="tablist"' in page
    tabs = re.findall(r'<a role="tab" ([^>]*)>', page)
    assert len(tabs) == 6
    for tab in tabs:
        panel = re.search(r'aria-controls="(tab-\w+)"', tab).group(1)
        link = re.search(r'id="(tablink-\w+)"', tab).group(1)
        assert re.search(
            rf'<section class="tab" id="{panel}" role="tabpanel" aria-labelledby="{link}"', page
        )
    assert [('aria-selected="true"' in t, 'tabindex="0"' in t) for t in tabs] == [(True, True)] + [
        (False, False)
    ] * 5
