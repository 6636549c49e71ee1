"""Job arrays (jobs.actions.arrays): the spec and the array file, one submission making N full
jobs of the ledger, --max-parallel at the scheduler, and the verbs on every task."""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.actions.arrays import MAX_TASKS, expand, parse_spec
from jobs.errors import BadRequest
from jobs.ledger.transitions import transition
from jobs.loops.launcher import launch_spec
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Attempt, Job, JobArray, JobEvent
from jobs.states import JobStatus as S
from tests.api_helpers import upload_snapshot

pytestmark = pytest.mark.django_db


@pytest.fixture
def big(make_team, make_user, noop_cluster):
    """Team lab on the 1,000-GPU bench cluster, so only --max-parallel holds tasks back."""
    team = make_team("lab", gpu_quota=1000, cluster=noop_cluster)
    return make_user("lee", team)


def submit(api, **body):
    return api.post("/arrays", {"entrypoint": ["python", "train.py", "--seed", "{index}"], **body})


@pytest.mark.parametrize(
    ("spec", "indices"),
    [
        ("0-3", [0, 1, 2, 3]),
        ("0-9:4", [0, 4, 8]),
        ("1,3,10-14:2", [1, 3, 10, 12, 14]),
        ("7", [7]),
    ],
)
def test_the_spec_gives_the_indices(spec, indices):
    assert parse_spec(spec) == indices


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("5-1", "the range 5-1 ends before it starts"),
        ("0-100000000", "indices go up to"),
        (f"0-{MAX_TASKS}", f"more than {MAX_TASKS} tasks"),
        ("0-3,2", "gives index 2 more than once"),
        ("0-3:0", "the step of 0-3:0 must be 1 or more"),
        ("a-b", "is not an index or a range"),
        ("", "is not an index or a range"),
    ],
)
def test_bad_specs_are_refused_with_a_sentence(spec, words, api):
    with pytest.raises(BadRequest, match=words.replace("(", r"\(")):
        parse_spec(spec)
    answer = submit(api, array=spec)
    assert answer.status_code == 400 and words in answer.json()["detail"], answer.content
    assert not Job.objects.exists() and not JobArray.objects.exists()


def test_placeholders_are_filled_and_other_braces_kept():
    argv = ["train.py", "--seed", "{index}", "--lr={lr}", "{not_a_param}", '{"a": 1}', "{depth}"]
    assert expand(argv, 3, {"lr": 0.001, "depth": 12}) == [
        "train.py",
        "--seed",
        "3",
        "--lr=0.001",
        "{not_a_param}",
        '{"a": 1}',
        "12",
    ]


def test_one_submission_makes_n_full_jobs_sharing_one_snapshot(api):
    sha = upload_snapshot(api)
    answer = submit(api, array="0-7:2", snapshot=sha, gpus=1, name="sweep")
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert (body["size"], body["counts"], body["summary"]) == (4, {"QUEUED": 4}, "4 QUEUED")
    tasks = list(Job.objects.order_by("array_index"))
    assert [t.array_index for t in tasks] == [0, 2, 4, 6]
    assert [t.entrypoint[-1] for t in tasks] == ["0", "2", "4", "6"]
    assert {t.snapshot_id for t in tasks} == {sha} and len({t.run_id for t in tasks}) == 4
    assert [t.name for t in tasks] == ["sweep[0]", "sweep[2]", "sweep[4]", "sweep[6]"]
    assert JobEvent.objects.filter(to_status="QUEUED").count() == 4
    # Each task is a job like any other: its own row in the jobs API.
    assert api.get(f"/jobs/{tasks[1].pk}").json()["status"] == "QUEUED"


def test_an_array_file_gives_each_task_its_parameters_and_the_runner_its_variables(api):
    params = [{"lr": 0.1, "depth": 4}, {"lr": 0.01, "depth": 8}]
    answer = api.post(
        "/arrays",
        {"entrypoint": ["python", "train.py", "--lr", "{lr}"], "array_params": params},
    )
    assert answer.status_code == 201, answer.content
    assert answer.json()["spec"] == "file"
    second = Job.objects.get(array_index=1)
    assert second.entrypoint == ["python", "train.py", "--lr", "0.01"]
    attempt = Attempt.objects.create(job=second, number=1, total_gpus=1, backend_name="sf-x-a1")
    env = launch_spec(second, attempt).env
    assert env["SF_ARRAY_INDEX"] == "1" and env["SF_ARRAY_ID"] == str(second.array_id)
    assert json.loads(env["SF_ARRAY_PARAMS"]) == {"lr": 0.01, "depth": 8}


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"array_params": [{"a": 1}, "x"]}, "parameter set 2 of the array file is not a JSON"),
        ({"array_params": []}, "has no parameter sets"),
        ({"array_params": [{"a": "x" * 5000}]}, "parameter set 1 of the array file is over"),
        ({"array": "0-3", "array_params": [{"a": 1}]}, "not both"),
        ({}, "not both"),
        ({"array": "0-3", "max_parallel": 5}, "--max-parallel must be from 1 to the array's 4"),
        ({"array": "0-3", "then": ["eval"]}, "--then does not apply to an array"),
        ({"array": "0-3", "gpus": 99}, "could never start"),
    ],
)
def test_bad_arrays_are_refused_and_nothing_is_half_made(api, body, words):
    answer = api.post("/arrays", {"entrypoint": ["python", "train.py"], **body})
    assert answer.status_code == 400 and words in answer.json()["detail"], answer.content
    assert not Job.objects.exists() and not JobArray.objects.exists()


def test_submission_takes_a_few_queries_whatever_the_size(api):
    sizes = {}
    for n in (10, 1000):
        with CaptureQueriesContext(connection) as seen:
            assert submit(api, array=f"0-{n - 1}").status_code == 201
        sizes[n] = len(seen.captured_queries)
    if connection.vendor == "postgresql":
        assert sizes[1000] <= sizes[10] + 6, sizes  # bulk inserts in batches of 1,000
    else:  # SQLite's variable limit makes batches of a few dozen rows: still no query per task
        assert sizes[1000] <= sizes[10] + 100, sizes
    assert Job.objects.count() == 1010


def test_max_parallel_caps_the_tasks_active_at_once(api_as, big):
    api = api_as(big)
    array = submit(api, array="0-9", max_parallel=3, team="lab").json()
    first = admit_queued_jobs()
    assert len(first.admitted) == 3
    waiting = Job.objects.filter(status=S.QUEUED)
    assert waiting.count() == 7
    assert set(waiting.values_list("status_reason", flat=True)) == {
        f"waiting for its array: at most 3 of array {array['id']}'s tasks run at once "
        "(--max-parallel)"
    }
    assert admit_queued_jobs().admitted == []  # still 3 active
    done = Job.objects.filter(status=S.SUBMITTED).order_by("pk").first()
    transition(done.pk, S.PENDING, actor="test")
    transition(done.pk, S.RUNNING, actor="test")
    transition(done.pk, S.SUCCEEDED, actor="test")
    assert len(admit_queued_jobs().admitted) == 1
    assert Job.objects.filter(status__in=S.active()).count() == 3
    # An array without a cap: every task is admitted through the other gates.
    submit(api, array="0-19", team="lab")
    assert len(admit_queued_jobs().admitted) == 20


def test_a_tick_over_a_large_capped_array_asks_a_few_queries(api_as, big):
    api = api_as(big)
    submit(api, array="0-1999", max_parallel=8, team="lab")
    admit_queued_jobs()
    with CaptureQueriesContext(connection) as seen:
        result = admit_queued_jobs()
    assert result.admitted == []
    assert len(seen.captured_queries) < 40, len(seen.captured_queries)


def test_the_verbs_act_on_every_task_that_allows_them(api_as, big):
    api = api_as(big)
    array = submit(api, array="0-5", team="lab").json()
    tasks = list(Job.objects.order_by("array_index"))
    for task in tasks[:2]:  # two failed, one succeeded, three still queued
        _ends(task, S.FAILED)
    _ends(tasks[2], S.SUCCEEDED)
    stopped = api.post(f"/arrays/{array['id']}/stop").json()
    assert (stopped["acted"], stopped["left"]) == (3, 3)
    assert stopped["counts"] == {"FAILED": 2, "STOPPED": 3, "SUCCEEDED": 1}
    retried = api.post(f"/arrays/{array['id']}/retry", {"failed": True}).json()
    assert retried["acted"] == 2 and retried["counts"]["QUEUED"] == 2
    assert set(Job.objects.filter(status=S.QUEUED).values_list("retry_count", flat=True)) == {1}
    everything = api.post(f"/arrays/{array['id']}/retry").json()
    assert everything["acted"] == 3  # the stopped ones; the succeeded one is left
    assert Job.objects.get(pk=tasks[2].pk).status == S.SUCCEEDED
    paused = api.post(f"/arrays/{array['id']}/pause").json()
    assert paused["acted"] == 5 and paused["counts"] == {"PAUSED": 5, "SUCCEEDED": 1}
    resumed = api.post(f"/arrays/{array['id']}/resume").json()
    assert resumed["acted"] == 5 and resumed["counts"]["QUEUED"] == 5
    refused = api.post(f"/arrays/{array['id']}/pause", {"failed": True})
    assert refused.status_code == 400
    assert "--failed goes with retry only" in refused.json()["detail"]


def test_an_array_reads_with_its_tasks_and_their_latest_metrics(api):
    from jobs.stores.metrics.ingest import append

    array = submit(api, array="0-2").json()
    first = Job.objects.get(array_index=0)
    Attempt.objects.create(job=first, number=1, total_gpus=1, backend_name="sf-a-a1")
    now = timezone.now().timestamp()
    append(
        first.pk,
        1,
        [
            {"seq": 0, "kind": "train", "name": "loss", "step": 1, "value": 2.0, "ts": now},
            {"seq": 1, "kind": "train", "name": "loss", "step": 2, "value": 1.5, "ts": now},
        ],
    )
    shown = api.get(f"/arrays/{array['id']}").json()
    assert shown["metrics"] == ["loss"]
    assert [t["index"] for t in shown["tasks"]] == [0, 1, 2]
    assert shown["tasks"][0]["latest"] == {"loss": 1.5} and shown["tasks"][1]["latest"] == {}
    listed = api.get("/arrays").json()
    assert [(a["id"], a["counts"]) for a in listed] == [(array["id"], {"QUEUED": 3})]


def test_another_teams_array_is_not_there(api, api_as, make_team, make_user):
    array = submit(api, array="0-2").json()
    outsider = api_as(make_user("bob", make_team("audio")))
    assert outsider.get(f"/arrays/{array['id']}").status_code == 404
    assert outsider.post(f"/arrays/{array['id']}/stop").status_code == 404
    assert outsider.get("/arrays").json() == []
    assert Job.objects.filter(status=S.QUEUED).count() == 3


def _ends(job: Job, status: str) -> None:
    for step in (S.SUBMITTED, S.PENDING, S.RUNNING, status):
        transition(job.pk, step, actor="test")


def test_the_console_shows_the_array_as_a_table_of_tasks_and_acts_on_all(api, alice):
    from django.test import Client

    array = submit(api, array="0-3", name="sweep").json()
    _ends(Job.objects.get(array_index=3), S.FAILED)
    console = Client()
    console.force_login(alice)
    page = console.get(f"/arrays/{array['id']}/")
    text = page.content.decode()
    assert page.status_code == 200 and "3 QUEUED, 1 FAILED" in text
    assert text.count('href="/jobs/') == 4
    task = console.get(f"/jobs/{Job.objects.get(array_index=2).pk}/").content.decode()
    assert f'Task 2 of <a href="/arrays/{array["id"]}/">array a{array["id"]}</a>' in task
    moved = console.post(f"/arrays/{array['id']}/retry/", {"failed": "1"}, follow=True)
    assert "retry: 1 task(s) moved, 3 left as they were" in moved.content.decode()
    assert Job.objects.filter(status=S.QUEUED).count() == 4
    assert console.get(f"/arrays/{array['id']}/nonsense/").status_code == 405
    assert console.post(f"/arrays/{array['id']}/nonsense/").status_code == 404


def test_the_jobs_list_can_leave_the_tasks_out_and_says_whose_a_task_is(api, alice, make_user):
    from tests.factories import queued_job

    array = submit(api, array="0-2").json()
    single = queued_job(Job.objects.first().team, alice)
    every = api.get("/jobs").json()["items"]
    assert len(every) == 4
    tasks = [j for j in every if j["array"] == array["id"]]
    assert sorted(j["array_index"] for j in tasks) == [0, 1, 2]
    folded = api.get("/jobs", tasks="false").json()["items"]
    assert [j["id"] for j in folded] == [single.pk] and folded[0]["array"] is None
    carol = make_user("carol", single.team)
    assert api.get("/arrays", mine="true").json()[0]["id"] == array["id"]
    assert api.get("/arrays", user="carol").json() == [] and carol
    assert api.get("/arrays", team="nope").json() == []
