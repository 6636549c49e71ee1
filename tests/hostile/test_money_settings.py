"""Prices and money budgets are staff's (issue 50, point 4): a member or a team admin who tries
to set a price or a budget gets a 403 with a sentence and nothing is written; a member reads
only the prices of the clusters their teams may use; a price never starts in the past; another
team's cost never shows, in a job's JSON or in usage."""

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone

from jobs.models import GpuPrice, Team
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db
PRICE = {"cluster": "local", "gpu_type": "H100", "per_gpu_hour": "4.25"}


def put(client, path: str, body: dict):
    return client.client.put(f"/api/v1{path}", body, content_type="application/json")


@pytest.fixture
def staff(make_user):
    user = make_user("root")
    user.is_staff = True
    user.save()
    return user


@pytest.fixture
def boss(make_user, team):
    return make_user("boss", team, role="admin")


def test_a_member_and_a_team_admin_cannot_set_prices(api, api_as, boss):
    for client in (api, api_as(boss)):
        answer = client.post("/prices", PRICE)
        assert answer.status_code == 403, answer.content
        assert answer.json()["detail"] == (
            "only staff set GPU prices; ask your Starforge administrator"
        )
    assert not GpuPrice.objects.exists()


def test_a_member_and_a_team_admin_cannot_set_the_money_budget(api, api_as, boss, team):
    body = {"money_budget_per_month": "1000000", "budget_alert_percents": ""}
    for client in (api, api_as(boss)):
        answer = put(client, "/teams/vision/budget", body)
        assert answer.status_code == 403, answer.content
        assert "only staff set budgets" in answer.json()["detail"]
    # Nor through the team's defaults, which a team admin may set: the field is not one.
    answer = api_as(boss).client.patch(
        "/api/v1/teams/vision",
        {"money_budget_per_month": "1000000", "budget_alert_percents": ""},
        content_type="application/json",
    )
    assert answer.status_code < 500, answer.content
    team.refresh_from_db()
    assert (team.money_budget_per_month, team.budget_alert_percents) == (None, "50,80,100")


def test_staff_add_a_price_and_set_a_budget(api_as, staff, team):
    tomorrow = (timezone.now() + dt.timedelta(days=1)).replace(microsecond=0).isoformat()
    made = api_as(staff).post("/prices", {**PRICE, "valid_from": tomorrow})
    assert made.status_code == 201, made.content
    assert (made.json()["per_gpu_hour"], made.json()["currency"]) == ("4.25", "USD")
    again = api_as(staff).post("/prices", {**PRICE, "valid_from": tomorrow})
    assert again.status_code == 409
    assert "already has a H100 price" in again.json()["detail"]
    answer = put(
        api_as(staff),
        "/teams/vision/budget",
        {
            "money_budget_per_month": "5000",
            "budget_alert_percents": "90, 50",
            "budget_hard_stop": True,
        },
    )
    assert answer.status_code == 200, answer.content
    assert answer.json() | {"spent_this_month": "-"} == {
        "team": "vision",
        "money_budget_per_month": "5000.00",
        "budget_alert_percents": "50,90",
        "budget_hard_stop": True,
        "spent_this_month": "-",
        "currency": "USD",
    }


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({**PRICE, "per_gpu_hour": "1e400"}, "from 0 to"),
        ({**PRICE, "per_gpu_hour": "NaN"}, "from 0 to"),
        ({**PRICE, "per_gpu_hour": "-1"}, "from 0 to"),
        ({**PRICE, "per_gpu_hour": "two"}, "decimal string"),
        ({**PRICE, "per_gpu_hour": "0.0000001"}, "at most 6 decimal places"),
        ({**PRICE, "cluster": "nope"}, "unknown cluster"),
        ({**PRICE, "valid_from": "2020-01-01T00:00:00Z"}, "lies in the past"),
    ],
)
def test_a_bad_price_is_refused_with_a_sentence(api_as, staff, body, words):
    answer = api_as(staff).post("/prices", body)
    assert answer.status_code == 400, answer.content
    assert words in answer.json()["detail"]
    assert not GpuPrice.objects.exists()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"budget_alert_percents": "50,<b>80</b>"}, "whole percents"),
        ({"budget_alert_percents": "0"}, "whole percents"),
        ({"money_budget_per_month": "1.001"}, "at most 2 decimal places"),
    ],
)
def test_a_bad_budget_is_refused_with_a_sentence(api_as, staff, team, body, words):
    answer = put(api_as(staff), "/teams/vision/budget", body)
    assert answer.status_code == 400, answer.content
    assert words in answer.json()["detail"]
    assert Team.objects.get(pk=team.pk).budget_alert_percents == "50,80,100"


def test_a_member_reads_only_the_prices_of_their_teams_clusters(api, team, noop_cluster, make_team):
    since = timezone.now()
    GpuPrice.objects.create(
        cluster=team.default_cluster, per_gpu_hour=Decimal("2"), valid_from=since
    )
    make_team("secret", cluster=noop_cluster)
    GpuPrice.objects.create(cluster=noop_cluster, per_gpu_hour=Decimal("9"), valid_from=since)
    listed = api.get("/prices").json()
    assert [(p["cluster"], p["per_gpu_hour"]) for p in listed] == [("local", "2")]


def test_another_teams_job_and_cost_never_show(api, make_team, make_user):
    other = make_team("other")
    GpuPrice.objects.create(
        cluster=other.default_cluster,
        per_gpu_hour=Decimal("7"),
        valid_from=timezone.now() - dt.timedelta(days=1),
    )
    job = queued_job(other, make_user("olga", other), total_gpus=2)
    with_attempt(job, "RUNNING", start_time=timezone.now() - dt.timedelta(hours=1))
    assert api.get(f"/jobs/{job.pk}").status_code == 404
    assert api.get("/usage").json()["total_cost"] == "0.00"
    assert api.get("/usage", team="other").status_code == 404


def test_in_the_admin_staff_add_a_price_that_cannot_be_edited_and_members_cannot_reach_it(
    client, alice, team
):
    from django.contrib.auth.models import User

    client.force_login(alice)
    assert client.get("/admin/jobs/gpuprice/add/").status_code == 302  # to the admin's sign-in
    client.force_login(User.objects.create_superuser("root", password="pw"))
    added = client.post(
        "/admin/jobs/gpuprice/add/",
        {
            "cluster": team.default_cluster_id,
            "gpu_type": "A40",
            "per_gpu_hour": "1.75",
            "valid_from_0": timezone.now().strftime("%Y-%m-%d"),
            "valid_from_1": (timezone.now() + dt.timedelta(minutes=1)).strftime("%H:%M:%S"),
        },
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    price = GpuPrice.objects.get()
    assert price.per_gpu_hour == Decimal("1.75")
    page = client.get(f"/admin/jobs/gpuprice/{price.pk}/change/")
    assert page.status_code == 200 and b'name="per_gpu_hour"' not in page.content  # read-only
    client.post(f"/admin/jobs/gpuprice/{price.pk}/change/", {"per_gpu_hour": "99"})
    price.refresh_from_db()
    assert price.per_gpu_hour == Decimal("1.75")
    past = client.post(
        "/admin/jobs/gpuprice/add/",
        {
            "cluster": team.default_cluster_id,
            "gpu_type": "A40",
            "per_gpu_hour": "0.10",
            "valid_from_0": "2020-01-01",
            "valid_from_1": "00:00:00",
        },
    )
    assert b"a new price starts now or later" in past.content
    assert GpuPrice.objects.count() == 1


def test_an_outsider_does_not_learn_that_a_team_exists(api_as, make_team, make_user):
    outsider = make_user("bob", make_team("nlp"))
    answer = put(api_as(outsider), "/teams/vision/budget", {"money_budget_per_month": "1"})
    assert answer.status_code == 404
    assert answer.json()["detail"] == "team vision does not exist or you are not in it"
