"""POST /api/v1/jobs: what a good request creates, and how every bad one is refused unchanged."""

import pytest
from django.test import Client

from jobs.actions.tokens import issue_token
from jobs.auth import hash_token
from jobs.models import ApiToken, Cluster, Job, JobEvent, ScheduleWindow
from jobs.stores.snapshots import snapshot_path
from tests.api_helpers import assert_refused, upload_snapshot

pytestmark = pytest.mark.django_db


def ledger() -> tuple[list, list]:
    jobs = Job.objects.order_by("pk").values_list("pk", "status", "status_reason", "retry_count")
    return list(jobs), list(JobEvent.objects.order_by("pk").values_list("pk", flat=True))


def post_raw(api, body: bytes, content_type: str = "application/json"):
    return api.client.post("/api/v1/jobs", body, content_type=content_type)


@pytest.fixture
def before(api):
    """The ledger as it stands before the request under test (with one earlier job in it)."""
    assert api.post("/jobs", {"entrypoint": ["python", "earlier.py"]}).status_code == 201
    return ledger()


# -- the happy path ------------------------------------------------------------------------------


def test_submit_answers_201_with_a_queued_job_and_a_run_id(api):
    response = api.post("/jobs", {"entrypoint": ["python", "train.py"], "gpus": 2})
    assert response.status_code == 201
    body = response.json()
    job = Job.objects.get()
    assert (body["id"], body["status"], body["gpus"]) == (job.pk, "QUEUED", 2)
    assert body["run_id"] == job.run_id and len(job.run_id) >= 8
    assert (body["team"], body["user"], body["entrypoint"]) == (
        "vision",
        "alice",
        ["python", "train.py"],
    )
    assert (job.status, job.attempt_count, job.retry_count) == ("QUEUED", 0, 0)


def test_submit_writes_one_queued_event_with_the_submitter_as_actor(api):
    api.post("/jobs", {"entrypoint": ["python", "train.py"]})
    event = JobEvent.objects.get()
    assert (event.kind, event.from_status, event.to_status) == ("status", "", "QUEUED")
    assert event.actor == "alice"


def test_two_submissions_get_two_rows_with_distinct_run_ids(api):
    first = api.post("/jobs", {"entrypoint": ["a"]}).json()
    second = api.post("/jobs", {"entrypoint": ["a"]}).json()
    assert first["id"] != second["id"] and first["run_id"] != second["run_id"]


def test_zero_gpus_is_a_valid_request(api):
    response = api.post("/jobs", {"entrypoint": ["python", "cpu.py"], "gpus": 0})
    assert response.status_code == 201
    assert response.json()["gpus"] == 0
    assert Job.objects.get().total_gpus == 0


def test_without_a_cluster_the_job_goes_to_the_team_default_cluster(api, team):
    bench = Cluster.objects.create(name="bench", kind="noop", settings={"gpus": 16})
    team.default_cluster = bench
    team.save()
    response = api.post("/jobs", {"entrypoint": ["a"]})
    assert response.status_code == 201
    assert response.json()["cluster"] == "bench"
    assert Job.objects.get().cluster == bench


def test_a_named_cluster_overrides_the_team_default(api, grant):
    grant(Cluster.objects.create(name="bench", kind="noop", settings={"gpus": 16}))
    response = api.post("/jobs", {"entrypoint": ["a"], "cluster": "bench"})
    assert response.status_code == 201
    assert response.json()["cluster"] == "bench"


def test_submit_with_an_uploaded_snapshot_records_its_sha(api):
    sha = upload_snapshot(api)
    response = api.post("/jobs", {"entrypoint": ["python", "train.py"], "snapshot": sha})
    assert response.status_code == 201
    assert response.json()["snapshot"] == sha
    assert Job.objects.get().snapshot_id == sha


def test_submit_keeps_env_name_priority_and_window(api):
    ScheduleWindow.objects.create(name="nights", spec="mon-sun 20:00-08:00")
    response = api.post(
        "/jobs",
        {
            "entrypoint": ["a"],
            "env": {"LR": "0.1", "_PRIVATE": ""},
            "name": "sweep",
            "priority": 5,
            "window": "nights",
        },
    )
    assert response.status_code == 201
    job = Job.objects.get()
    assert (job.env, job.name, job.priority, job.window.name) == (
        {"LR": "0.1", "_PRIVATE": ""},
        "sweep",
        5,
        "nights",
    )


# -- refused, and nothing written -----------------------------------------------------------------


def test_negative_gpus_is_refused_with_422(api, before):
    assert_refused(api.post("/jobs", {"entrypoint": ["a"], "gpus": -1}), 422, "gpus")
    assert ledger() == before


def test_a_missing_entrypoint_is_refused_with_422(api, before):
    assert_refused(api.post("/jobs", {"gpus": 1}), 422, "entrypoint")
    assert ledger() == before


def test_an_empty_entrypoint_list_is_refused_with_422(api, before):
    assert_refused(api.post("/jobs", {"entrypoint": []}), 422, "entrypoint")
    assert ledger() == before


def test_an_entrypoint_with_an_empty_argument_is_refused_with_422(api, before):
    assert_refused(api.post("/jobs", {"entrypoint": [""]}), 422, "entrypoint")
    assert ledger() == before


def test_an_unknown_cluster_is_refused_with_404_naming_the_teams_own(api, before):
    Cluster.objects.create(name="bench", kind="noop")  # exists, but not vision's
    detail = assert_refused(
        api.post("/jobs", {"entrypoint": ["a"], "cluster": "nowhere"}), 404, "'nowhere'"
    )["detail"]
    assert detail == "team vision has no cluster 'nowhere'; clusters it may use: local"
    assert ledger() == before


def test_a_disabled_cluster_is_refused_with_400(api, grant, before):
    grant(Cluster.objects.create(name="old", kind="noop", enabled=False))
    assert_refused(api.post("/jobs", {"entrypoint": ["a"], "cluster": "old"}), 400, "disabled")
    assert ledger() == before


def test_an_unknown_snapshot_sha_is_refused_with_404(api, before):
    response = api.post("/jobs", {"entrypoint": ["a"], "snapshot": "0" * 64})
    assert_refused(response, 404, "snapshot", "unknown")
    assert ledger() == before


def test_a_snapshot_whose_file_is_gone_is_refused_with_404(api, before):
    sha = upload_snapshot(api)
    snapshot_path(sha).unlink()
    assert_refused(api.post("/jobs", {"entrypoint": ["a"], "snapshot": sha}), 404, "snapshot")
    assert ledger() == before


def test_an_unknown_window_is_refused_with_400(api, before):
    response = api.post("/jobs", {"entrypoint": ["a"], "window": "weekends"})
    assert_refused(response, 400, "window", "'weekends'")
    assert ledger() == before


def test_more_gpus_than_the_team_quota_is_refused_as_never_startable(api, before):
    response = api.post("/jobs", {"entrypoint": ["a"], "gpus": 9})
    assert_refused(response, 400, "quota", "could never start")
    assert ledger() == before


def test_past_its_quota_a_team_that_may_borrow_submits_up_to_its_borrow_cap(
    api, team, grant, before
):
    big = grant(Cluster.objects.create(name="big", kind="noop", settings={"gpus": 64}))
    team.borrow_cap = 12
    team.save()
    job = {"entrypoint": ["a"], "cluster": big.name}
    assert api.post("/jobs", {**job, "gpus": 12}).status_code == 201
    response = api.post("/jobs", {**job, "gpus": 13})
    assert_refused(response, 400, "quota is 8 and it may borrow at most 12; it could never start")


def test_more_gpus_than_the_cluster_has_is_refused_as_never_startable(api, grant, before):
    tiny = grant(Cluster.objects.create(name="tiny", kind="noop", settings={"gpus": 2}))
    response = api.post("/jobs", {"entrypoint": ["a"], "gpus": 3, "cluster": tiny.name})
    assert_refused(response, 400, "cluster tiny has 2", "could never start")
    assert ledger() == before


@pytest.mark.parametrize("name", ["1LEADING_DIGIT", "HAS-DASH", "HAS SPACE", "", "TRAILING\n"])
def test_an_invalid_env_var_name_is_refused_with_400(api, before, name):
    response = api.post("/jobs", {"entrypoint": ["a"], "env": {name: "x"}})
    assert_refused(response, 400, "environment variable name")
    assert ledger() == before


@pytest.mark.parametrize("name", ["SF_RUN_ID", "SF_OUTPUT_DIR", "SF_ANYTHING", "SF_JOB_TOKEN"])
def test_a_reserved_env_var_is_refused_with_400(api, before, name):
    response = api.post("/jobs", {"entrypoint": ["a"], "env": {name: "x"}})
    assert_refused(response, 400, name, "set by Starforge")
    assert ledger() == before


def test_a_nul_character_in_the_entrypoint_is_refused_with_422(api, before):
    response = api.post("/jobs", {"entrypoint": ["python", "a\x00b"]})
    assert_refused(response, 422, "NUL")
    assert ledger() == before


def test_a_nul_character_in_an_env_value_is_refused_with_422(api, before):
    response = api.post("/jobs", {"entrypoint": ["a"], "env": {"A": "x\x00"}})
    assert_refused(response, 422, "NUL")
    assert ledger() == before


def test_a_nul_character_in_the_cluster_name_is_refused_with_422(api, before):
    response = api.post("/jobs", {"entrypoint": ["a"], "cluster": "lo\x00cal"})
    assert_refused(response, 422, "NUL")
    assert ledger() == before


def test_a_body_that_is_not_json_is_a_4xx_not_a_500(api, before):
    response = post_raw(api, b"entrypoint=python")
    assert 400 <= response.status_code < 500
    assert_refused(response, response.status_code, "parse")
    assert ledger() == before


def test_a_json_list_body_is_refused_as_not_an_object(api, before):
    assert_refused(post_raw(api, b'[["python", "a.py"]]'), 422, "JSON object")
    assert ledger() == before


def test_an_empty_body_is_refused_with_422(api, before):
    assert_refused(post_raw(api, b""), 422)
    assert ledger() == before


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpus", "two"),
        ("gpus", True),
        ("gpus", 1.5),
        ("priority", "high"),
        ("entrypoint", "python train.py"),
        ("entrypoint", [1, 2]),
        ("env", ["A=1"]),
        ("env", {"A": 1}),
        ("name", 7),
    ],
)
def test_a_field_of_the_wrong_type_is_refused_with_422_naming_it(api, before, field, value):
    body = {"entrypoint": ["a"], field: value}
    assert_refused(api.post("/jobs", body), 422, field)
    assert ledger() == before


def test_a_request_without_a_token_is_refused_with_401(client, before):
    response = client.post("/api/v1/jobs", {"entrypoint": ["a"]}, content_type="application/json")
    assert_refused(response, 401, "token")
    assert ledger() == before


def test_a_request_with_a_wrong_token_is_refused_with_401(before):
    anonymous = Client(HTTP_AUTHORIZATION="Bearer sf_not-a-real-token")
    response = anonymous.post(
        "/api/v1/jobs", {"entrypoint": ["a"]}, content_type="application/json"
    )
    assert_refused(response, 401, "token")
    assert ledger() == before


def test_a_revoked_token_is_refused_with_401(alice, before):
    secret = issue_token(alice, "laptop")
    ApiToken.objects.filter(key_hash=hash_token(secret)).update(revoked_at="2020-01-01T00:00Z")
    revoked = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    response = revoked.post("/api/v1/jobs", {"entrypoint": ["a"]}, content_type="application/json")
    assert_refused(response, 401, "token")
    assert ledger() == before


def test_a_viewer_cannot_submit(api_as, make_user, team, before):
    viewer = api_as(make_user("victor", team, role="viewer"))
    assert_refused(viewer.post("/jobs", {"entrypoint": ["a"]}), 403, "viewer")
    assert ledger() == before


def test_submitting_to_a_team_i_am_not_in_is_refused_with_403(api, make_team, before):
    make_team("audio")
    assert_refused(api.post("/jobs", {"entrypoint": ["a"], "team": "audio"}), 403, "audio")
    assert ledger() == before


def test_a_user_in_no_team_cannot_submit(api_as, make_user, before):
    loner = api_as(make_user("lonely"))
    assert_refused(loner.post("/jobs", {"entrypoint": ["a"]}), 403, "no team")
    assert ledger() == before
