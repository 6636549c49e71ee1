"""`GET /api/v1/usage/export` (metering.export): sacct-shaped records per attempt, as CSV that
Python's csv module reads into the documented columns and as JSON; GPU-seconds equal to
metering's; who sees which rows."""

import csv
import datetime as dt
import io

import pytest
from django.utils import timezone

from jobs.models import Membership
from metering.export import COLUMNS, alloc_tres, exit_code
from metering.records import meter_ended, usage_rows
from tests.conftest import ApiClient
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)
T0 = dt.datetime(2026, 11, 10, 8, 0, 0, 250000, tzinfo=dt.UTC)
WINDOW = "/usage/export?start=2026-11-01&end=2026-11-21"


@pytest.fixture(autouse=True)
def _frozen(monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: NOW)


def ran(team, user, start, seconds, gpus=1, running=False, **fields):
    job = queued_job(team, user, total_gpus=gpus, **fields.pop("job", {}))
    end = None if running else start + dt.timedelta(seconds=seconds)
    status = "RUNNING" if running else "SUCCEEDED"
    return with_attempt(job, status, start_time=start, end_time=end, **fields)


@pytest.fixture
def workload(team, alice, make_team, make_user):
    """vision: alice's success (2 GPUs, typed a100), her failure by a signal, bob's running
    job; nlp: carol's job, which vision never sees."""
    bob = make_user("bob", team)
    nlp = make_team("nlp")
    carol = make_user("carol", nlp)
    ran(team, alice, T0, 100.5, gpus=2, exit_code=0, job={"gpu_type": "a100"}, job_ref="41")
    ran(team, alice, T0 + dt.timedelta(hours=1), 10, exit_code=-9, failure="exit")
    ran(team, bob, NOW - dt.timedelta(seconds=30), 0, running=True)
    ran(nlp, carol, T0, 3600, gpus=4, exit_code=0)
    meter_ended()
    return {"bob": bob, "carol": carol, "nlp": nlp}


def records(client: ApiClient) -> list[dict[str, str]]:
    answer = client.get(WINDOW)
    assert answer.status_code == 200, answer.content
    assert answer["Content-Type"].startswith("text/csv")
    reader = csv.DictReader(io.StringIO(answer.content.decode()))
    assert tuple(reader.fieldnames or ()) == COLUMNS
    return list(reader)


def test_the_csv_parses_into_sacct_columns_and_its_gpu_seconds_are_meterings(
    workload, team, make_user
):
    admin = make_user("ada", team, role="admin")
    rows = records(ApiClient(admin))
    assert [(r["User"], r["Account"], r["State"]) for r in rows] == [
        ("alice", "vision", "COMPLETED"),
        ("alice", "vision", "FAILED"),
        ("bob", "vision", "RUNNING"),
    ]
    done, killed, running = rows
    assert done["Partition"] == team.default_cluster.name and done["EngineJobID"] == "41"
    assert (done["Submit"][:4], done["Start"], done["End"]) == (
        "2026",
        "2026-11-10T08:00:00",
        "2026-11-10T08:01:40",
    )
    assert (done["ElapsedRaw"], done["AllocTRES"], done["ExitCode"]) == (
        "100",
        "node=1,gres/gpu:a100=2",
        "0:0",
    )
    assert (killed["ExitCode"], killed["AllocTRES"]) == ("0:9", "node=1,gres/gpu=1")
    assert (running["End"], running["ElapsedRaw"]) == ("Unknown", "30")
    assert {r["IdleGPUSeconds"] for r in rows} == {"0.000000"}  # no activity was reported
    assert {(r["Cost"], r["Currency"]) for r in rows} == {("0.00", "USD")}  # no prices set
    # the GPU-seconds are metering's: the records' sum equals the usage the ledger holds
    exported = sum(float(r["GPUSeconds"]) for r in rows)
    held = usage_rows(dt.date(2026, 11, 1), dt.date(2026, 11, 21), NOW, teams=[team.pk])
    assert exported == pytest.approx(sum(held.values()) / 1e6, abs=1e-6)
    assert float(done["GPUSeconds"]) == 201.0


def test_members_see_their_own_attempts_admins_their_teams_staff_all(workload, alice, api):
    assert {r["User"] for r in records(api)} == {"alice"}
    assert {r["User"] for r in records(ApiClient(workload["bob"]))} == {"bob"}
    assert {r["Account"] for r in records(ApiClient(workload["carol"]))} == {"nlp"}
    alice.is_staff = True
    alice.save()
    assert {r["Account"] for r in records(ApiClient(alice))} == {"vision", "nlp"}


def test_another_teams_rows_never_appear_even_to_its_admin_elsewhere(workload, make_user, team):
    # ada administers nlp and is a plain member of vision: vision's rows are hers only
    ada = make_user("ada", workload["nlp"], role="admin")
    Membership.objects.create(team=team, user=ada, role=Membership.Role.MEMBER)
    rows = records(ApiClient(ada))
    assert {r["Account"] for r in rows} == {"nlp"}


def test_json_carries_the_same_records(workload, api):
    answer = api.get(WINDOW + "&format=json").json()
    assert answer["columns"] == list(COLUMNS)
    assert [r["State"] for r in answer["rows"]] == ["COMPLETED", "FAILED"]


@pytest.mark.parametrize(
    "query",
    ["start=yesterday", "start=2026-11-10&end=2026-11-01", "start=2024-01-01&end=2026-01-02"],
)
def test_a_bad_window_is_a_400_with_a_sentence(api, query):
    answer = api.get(f"/usage/export?{query}")
    assert answer.status_code == 400
    assert answer.json()["detail"]


def test_a_user_named_like_a_formula_is_not_a_formula_in_the_csv(team, make_user):
    evil = make_user("=HYPERLINK(1)", team)
    ran(team, evil, T0, 1)
    [row] = records(ApiClient(evil))
    assert row["User"] == "'=HYPERLINK(1)"


def test_sacct_words():
    assert alloc_tres(2, 4, "") == "node=2,gres/gpu=4"
    assert alloc_tres(1, 0, "a100") == "node=1"
    assert [exit_code(c) for c in (None, 0, 3, -15)] == ["0:0", "0:0", "3:0", "0:15"]
