"""Reading the ledger over the API: one job, its timeline and attempts, and the filtered list."""

import pytest
from django.test import Client

from jobs.loops.launcher import launch_spec
from jobs.models import Attempt, Cluster, Job, JobEvent, Membership
from tests.api_helpers import assert_refused, submit
from tests.factories import with_attempt

pytestmark = pytest.mark.django_db


def ids(response) -> list[int]:
    assert response.status_code == 200, response.content
    return [item["id"] for item in response.json()["items"]]


@pytest.fixture
def bob(make_user, team):
    return make_user("bob", team)


@pytest.fixture
def stranger(api_as, make_team, make_user):
    """Carol of team audio, who shares no team with alice."""
    return api_as(make_user("carol", make_team("audio")))


# -- one job ---------------------------------------------------------------------------------------


def test_get_job_answers_the_ledger_row(api):
    job_id = submit(api, gpus=2, name="resnet")
    body = api.get(f"/jobs/{job_id}").json()
    job = Job.objects.get(pk=job_id)
    assert (body["id"], body["run_id"], body["name"], body["gpus"]) == (
        job_id,
        job.run_id,
        "resnet",
        2,
    )
    assert (body["status"], body["terminal"], body["attempt"], body["job_ref"]) == (
        "QUEUED",
        False,
        0,
        "",
    )
    assert body["output_dir"].endswith(job.run_id)


@pytest.mark.parametrize("root", [None, "/runs", "/mnt/outputs/"])
def test_the_output_dir_shown_is_the_one_the_job_is_given(api, grant, settings, root):
    """A cluster that mounts run outputs elsewhere (`output_root`) gets them there; the job
    page, the list and `sf job status` say so."""
    cluster_settings = {"gpus": 16} | ({"output_root": root} if root else {})
    grant(Cluster.objects.create(name="mounted", kind="noop", settings=cluster_settings))
    job_id = submit(api, cluster="mounted")
    job = Job.objects.get(pk=job_id)
    given = launch_spec(job, with_attempt(job, "SUBMITTED")).env["SF_OUTPUT_DIR"]
    expected = f"{(root or str(settings.SF_OUTPUT_ROOT)).rstrip('/')}/{job.run_id}"
    assert given == expected
    assert api.get(f"/jobs/{job_id}").json()["output_dir"] == given
    assert [j["output_dir"] for j in api.get("/jobs").json()["items"]] == [given]


def test_an_unknown_job_id_is_404_with_a_sentence(api):
    assert_refused(api.get("/jobs/424242"), 404, "job 424242 does not exist")


def test_a_job_id_beyond_any_integer_column_is_404_not_500(api):
    assert_refused(api.get(f"/jobs/{2**70}"), 404)


def test_a_job_of_another_team_is_404_as_if_it_did_not_exist(api, stranger):
    job_id = submit(stranger)
    for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/events", f"/jobs/{job_id}/attempts"):
        assert_refused(api.get(path), 404, f"job {job_id} does not exist")


def test_a_viewer_can_read_the_job_its_events_and_attempts(api, api_as, make_user, team):
    job_id = submit(api)
    viewer = api_as(make_user("victor", team, role="viewer"))
    assert viewer.get(f"/jobs/{job_id}").json()["id"] == job_id
    assert [e["to_status"] for e in viewer.get(f"/jobs/{job_id}/events").json()] == ["QUEUED"]
    assert viewer.get(f"/jobs/{job_id}/attempts").json() == []
    assert ids(viewer.get("/jobs")) == [job_id]


def test_events_are_the_timeline_in_order(api):
    job_id = submit(api)
    api.post(f"/jobs/{job_id}/pause")
    api.post(f"/jobs/{job_id}/resume")
    events = api.get(f"/jobs/{job_id}/events").json()
    assert [(e["from_status"], e["to_status"]) for e in events] == [
        ("", "QUEUED"),
        ("QUEUED", "PAUSED"),
        ("PAUSED", "QUEUED"),
    ]
    assert {e["actor"] for e in events} == {"alice"}


def test_attempts_are_listed_by_number(api):
    job_id = submit(api)
    for number in (2, 1):
        Attempt.objects.create(
            job_id=job_id, number=number, total_gpus=1, backend_name=f"b-{number}"
        )
    attempts = api.get(f"/jobs/{job_id}/attempts").json()
    assert [(a["number"], a["backend_name"], a["gpu_seconds"]) for a in attempts] == [
        (1, "b-1", 0.0),
        (2, "b-2", 0.0),
    ]


def test_reading_without_a_token_is_401(api, client):
    job_id = submit(api)
    assert_refused(client.get(f"/api/v1/jobs/{job_id}"), 401, "token")
    assert_refused(client.get("/api/v1/jobs"), 401, "token")


def test_reading_with_a_wrong_token_is_401(api):
    job_id = submit(api)
    forged = Client(HTTP_AUTHORIZATION="Bearer sf_forged")
    assert_refused(forged.get(f"/api/v1/jobs/{job_id}"), 401, "token")


def test_me_names_the_user_and_their_teams(api, make_team, alice):
    Membership.objects.create(team=make_team("audio"), user=alice, role="viewer")
    body = api.get("/me").json()
    assert body["username"] == "alice" and body["default_team"] == "vision"
    assert [(t["name"], t["role"]) for t in body["teams"]] == [
        ("vision", "member"),
        ("audio", "viewer"),
    ]


# -- the list --------------------------------------------------------------------------------------


def test_the_list_holds_only_jobs_of_my_teams_newest_first(api, api_as, bob, stranger):
    mine = submit(api)
    teammate = submit(api_as(bob))
    submit(stranger)
    assert ids(api.get("/jobs")) == [teammate, mine]


def test_staff_see_every_team_in_the_list(api, api_as, make_user, stranger):
    own, other = submit(api), submit(stranger)
    admin = make_user("root")
    admin.is_staff = True
    admin.save()
    assert ids(api_as(admin).get("/jobs")) == [other, own]


def test_the_status_filter_keeps_only_that_status(api):
    queued, stopped = submit(api), submit(api)
    api.post(f"/jobs/{stopped}/stop")
    assert ids(api.get("/jobs", status="STOPPED")) == [stopped]
    assert ids(api.get("/jobs", status="queued")) == [queued]


def test_an_unknown_status_filter_is_400_listing_the_statuses(api):
    submit(api)
    assert_refused(api.get("/jobs", status="DONE"), 400, "'DONE'", "QUEUED", "SUCCEEDED")


def test_the_team_filter_keeps_only_that_team(api, make_team, alice):
    Membership.objects.create(team=make_team("audio"), user=alice)
    vision = submit(api)
    audio = submit(api, team="audio")
    assert ids(api.get("/jobs", team="audio")) == [audio]
    assert ids(api.get("/jobs", team="vision")) == [vision]


def test_the_team_filter_does_not_reveal_a_team_i_am_not_in(api, stranger):
    submit(stranger)
    assert ids(api.get("/jobs", team="audio")) == []


def test_the_user_filter_keeps_only_that_user(api, api_as, bob):
    submit(api)
    bobs = submit(api_as(bob))
    assert ids(api.get("/jobs", user="bob")) == [bobs]


def test_mine_keeps_only_my_jobs_and_wins_over_user(api, api_as, bob):
    own = submit(api)
    submit(api_as(bob))
    assert ids(api.get("/jobs", mine="true")) == [own]
    assert ids(api.get("/jobs", mine="true", user="bob")) == [own]


def test_a_nul_character_in_a_filter_is_422_not_500(api):
    assert_refused(api.get("/jobs", team="vi\x00sion"), 422, "NUL")


@pytest.mark.parametrize("limit", [0, -1, 501])
def test_a_limit_out_of_range_is_422(api, limit):
    assert_refused(api.get("/jobs", limit=limit), 422, "limit")


def test_a_before_of_zero_is_422(api):
    assert_refused(api.get("/jobs", before=0), 422, "before")


def test_paging_with_before_returns_every_job_exactly_once(api, api_as, bob, stranger):
    expected = [submit(api if n % 2 else api_as(bob)) for n in range(7)]
    submit(stranger)
    seen, before, pages = [], None, 0
    while True:
        params = {"limit": 3} if before is None else {"limit": 3, "before": before}
        page = api.get("/jobs", **params).json()
        seen += [item["id"] for item in page["items"]]
        pages += 1
        before = page["next_before"]
        if before is None:
            break
        assert pages < 10
    assert seen == sorted(expected, reverse=True)
    assert pages == 3


def test_a_page_that_ends_exactly_at_the_last_job_has_no_next_before(api):
    jobs = [submit(api) for _ in range(2)]
    page = api.get("/jobs", limit=2).json()
    assert [item["id"] for item in page["items"]] == jobs[::-1]
    assert page["next_before"] is None


def test_paging_composes_with_filters(api):
    queued = [submit(api) for _ in range(3)]
    stopped = submit(api)
    api.post(f"/jobs/{stopped}/stop")
    first = api.get("/jobs", status="QUEUED", limit=2).json()
    second = api.get("/jobs", status="QUEUED", limit=2, before=first["next_before"]).json()
    assert [i["id"] for i in first["items"] + second["items"]] == queued[::-1]
    assert second["next_before"] is None


def test_a_page_read_while_jobs_are_submitted_bills_every_job_it_shows(api, monkeypatch):
    import datetime as dt

    from django.utils import timezone

    from jobs.reads import job_rows

    jobs = [submit(api) for _ in range(3)]
    start = timezone.now() - dt.timedelta(seconds=100)
    for job_id in jobs:  # each ran 100 s on one GPU
        attempt = Attempt.objects.create(
            job_id=job_id, number=1, total_gpus=1, backend_name=f"b{job_id}", start_time=start,
            end_time=start + dt.timedelta(seconds=100),
        )  # fmt: skip
        Job.objects.filter(pk=job_id).update(current_attempt=attempt, attempt_count=1)
    read_page = job_rows.PAGE.rows

    def then_submits(*args, **kwargs):  # between the page's read and its attempts' read
        rows = read_page(*args, **kwargs)
        submit(api), submit(api)  # enough to push the page's own jobs off a newest-first read
        return rows

    monkeypatch.setattr(job_rows.PAGE, "rows", then_submits)
    page = api.get("/jobs", limit=2).json()
    assert [(i["id"], i["gpu_seconds"]) for i in page["items"]] == [
        (jobs[2], 100.0),
        (jobs[1], 100.0),
    ]


def test_reading_changes_nothing_in_the_ledger(api):
    job_id = submit(api)
    before = (list(Job.objects.values()), JobEvent.objects.count())
    api.get(f"/jobs/{job_id}")
    api.get("/jobs")
    api.get(f"/jobs/{job_id}/events")
    assert (list(Job.objects.values()), JobEvent.objects.count()) == before


def test_diagnostics_explain_the_job_in_sentences(api, api_as, make_user, make_team):
    job_id = submit(api)
    answer = api.get(f"/jobs/{job_id}/diagnostics").json()
    assert answer["status"] == "QUEUED"
    assert answer["sentences"][0].startswith("Waiting to be admitted")
    outsider = api_as(make_user("olga", make_team("other")))
    assert_refused(outsider.get(f"/jobs/{job_id}/diagnostics"), 404, "belongs to a team")
