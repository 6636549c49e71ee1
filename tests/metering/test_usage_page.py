"""The usage page: a month of my teams' GPU-hours, a stacked chart, a team filter, and CSV."""

import csv
import datetime as dt
import io
import json
from html import unescape

import pytest
from django.test import Client
from django.utils import timezone

from metering.records import meter_ended
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)
OCT31_23H = dt.datetime(2026, 10, 31, 23, 0, tzinfo=dt.UTC)


@pytest.fixture(autouse=True)
def _frozen(monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: NOW)


def ran(team, user, start, hours, total_gpus=1, running=False, borrowed_from=None):
    job = queued_job(team, user, total_gpus=total_gpus)
    end = None if running else start + dt.timedelta(hours=hours)
    with_attempt(
        job,
        "RUNNING" if running else "SUCCEEDED",
        start_time=start,
        end_time=end,
        borrowed_from=borrowed_from,
    )


@pytest.fixture
def page(team, alice, make_team, make_user):
    """vision: alice 2 GPUs 31 Oct 23:00 → 1 Nov 01:00, bob running 1 GPU since 10:00 today;
    nlp (alice is in it too): alice 3 GPU-h on 5 Nov; ops (not alice's): dan 9 GPU-h."""
    bob = make_user("bob", team)
    nlp = make_team("nlp")
    nlp.membership_set.create(user=alice, role="viewer")
    ops = make_team("ops")
    ran(team, alice, OCT31_23H, hours=2, total_gpus=2)
    ran(nlp, alice, dt.datetime(2026, 11, 5, 6, tzinfo=dt.UTC), hours=3)
    ran(ops, make_user("dan", ops), dt.datetime(2026, 11, 5, 6, tzinfo=dt.UTC), hours=9)
    meter_ended()
    ran(team, bob, NOW - dt.timedelta(hours=2), 0, running=True)
    client = Client()
    client.force_login(alice)
    return client


def chart(response) -> dict:
    html = response.content.decode()
    start = html.index('data-chart="') + len('data-chart="')
    return json.loads(unescape(html[start : html.index('"', start)]))


def test_the_chart_stacks_one_trace_per_team_over_the_days(page):
    response = page.get("/usage/", {"month": "2026-11"})
    assert response.status_code == 200
    assert chart(response) == {
        "data": [
            {"type": "bar", "name": "nlp", "x": ["2026-11-01", "2026-11-05", "2026-11-20"],
             "y": [0.0, 3.0, 0.0]},
            {"type": "bar", "name": "vision", "x": ["2026-11-01", "2026-11-05", "2026-11-20"],
             "y": [2.0, 0.0, 2.0]},
        ],
        "layout": {"barmode": "stack"},
    }  # fmt: skip


def test_the_tables_show_my_teams_by_team_user_cluster_and_day(page):
    html = page.get("/usage/").content.decode()  # default: this UTC month
    assert "GPU usage · November 2026" in html
    assert "<td>vision</td><td>4.00</td>" in html and "<td>nlp</td><td>3.00</td>" in html
    assert "<td>vision</td><td>bob</td><td>2.00</td>" in html
    assert "<td>local</td><td>7.00</td>" in html
    assert "<td>2026-11-05</td><td>3.00</td>" in html
    # Another team's name and its member's, as the page would show them (the bare words can
    # turn up by chance inside the page's random CSRF token).
    for word in ("ops", "dan"):
        assert f"<td>{word}</td>" not in html and f"<option>{word}</option>" not in html


def test_the_month_boundary_gives_october_its_share(page):
    html = page.get("/usage/", {"month": "2026-10"}).content.decode()
    assert "<td>vision</td><td>2.00</td>" in html
    assert "<td>2026-10-31</td><td>2.00</td>" in html


def test_the_team_filter_shows_one_team_and_refuses_others(page):
    response = page.get("/usage/", {"month": "2026-11", "team": "nlp"})
    assert [trace["name"] for trace in chart(response)["data"]] == ["nlp"]
    refused = page.get("/usage/", {"team": "ops"})
    assert refused.status_code == 404
    assert refused.content.decode() == "team ops does not exist or you are not in it"


@pytest.mark.parametrize("month", ["2026-13", "november", "2026-1", "2026-11-01"])
def test_a_malformed_month_is_refused_with_a_sentence(page, month):
    response = page.get("/usage/", {"month": month})
    assert response.status_code == 400
    assert response.content.decode() == f"month must be YYYY-MM, e.g. 2026-11; got {month!r}"


def test_csv_export_has_one_row_per_day_team_user_cluster(page):
    response = page.get("/usage/", {"month": "2026-11", "format": "csv"})
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="usage-2026-11.csv"'
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows == [
        [
            "day",
            "team",
            "user",
            "cluster",
            "gpu_type",
            "gpu_hours",
            "gpu_seconds",
            "borrowed_gpu_hours",
            "active_gpu_seconds",
            "idle_gpu_seconds",
            "efficiency",
            "cost",
            "currency",
        ],
        [
            "2026-11-01",
            "vision",
            "alice",
            "local",
            "",
            "2.0",
            "7200.0",
            "0.0",
            "0.0",
            "0.0",
            "0.0",
            "0.00",
            "USD",
        ],
        [
            "2026-11-05",
            "nlp",
            "alice",
            "local",
            "",
            "3.0",
            "10800.0",
            "0.0",
            "0.0",
            "0.0",
            "0.0",
            "0.00",
            "USD",
        ],
        [
            "2026-11-20",
            "vision",
            "bob",
            "local",
            "",
            "2.0",
            "7200.0",
            "0.0",
            "0.0",
            "0.0",
            "0.0",
            "0.00",
            "USD",
        ],
    ]


def test_gpu_hours_on_borrowed_gpus_are_shown_per_team(page, team, make_user, api_as):
    """Recorded (metered) and still running alike: 3 GPU-h on the 10th, and 2 GPUs for the
    last hour, both on GPUs borrowed from team ops."""
    from jobs.models import Team

    ops = Team.objects.get(name="ops")
    carl = make_user("carl", team)
    ran(team, carl, dt.datetime(2026, 11, 10, 6, tzinfo=dt.UTC), hours=3, borrowed_from=ops)
    meter_ended()
    ran(team, carl, NOW - dt.timedelta(hours=1), 0, total_gpus=2, running=True, borrowed_from=ops)
    html = page.get("/usage/").content.decode()
    assert "<td>vision</td><td>9.00</td><td>5.00</td>" in html
    assert "<td>nlp</td><td>3.00</td><td>0.00</td>" in html
    rows = list(csv.reader(io.StringIO(page.get("/usage/", {"format": "csv"}).content.decode())))
    assert [
        "2026-11-10",
        "vision",
        "carl",
        "local",
        "",
        "3.0",
        "10800.0",
        "3.0",
        "0.0",
        "0.0",
        "0.0",
        "0.00",
        "USD",
    ] in rows
    assert [
        "2026-11-20",
        "vision",
        "carl",
        "local",
        "",
        "2.0",
        "7200.0",
        "2.0",
        "0.0",
        "0.0",
        "0.0",
        "0.00",
        "USD",
    ] in rows
    by_team = api_as(carl).get("/usage", by="team").json()["rows"]
    assert by_team == [
        {
            "team": "vision",
            "gpu_seconds": 32400.0,
            "gpu_hours": 9.0,
            "borrowed_gpu_hours": 5.0,
            "cost": "0.00",
            "active_gpu_hours": 0.0,
            "idle_gpu_hours": 0.0,
            "efficiency": 0.0,
        }
    ]


def test_signed_out_visitors_are_sent_to_sign_in(db):
    assert Client().get("/usage/").status_code == 302
