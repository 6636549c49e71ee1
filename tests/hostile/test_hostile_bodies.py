"""Bodies that once answered 500 or reached a job's runner (issue 47, point 9): each is refused
with a 4xx and a sentence, and nothing of it is kept.

JSON lets a body say what no job can be given: NaN and Infinity (and 1e400, which Python parses
as Infinity), which neither PostgreSQL nor SQLite stores as JSON; a lone surrogate ("\\ud800"),
which has no UTF-8, so the database, a file name or the runner's exec fails on it; NUL, which
ends a C string, so an argv or environment holding one cannot be exec'd (an array parameter
holding one was accepted and killed its task's runner). `jobs.schemas.text_fault` and
`json_fault` decide, for every string field of a body and the array file's parameter sets.
Webhook URLs are tested with the webhooks (tests/hostile/test_webhook_targets.py).
"""

import json

import pytest
from django.test import Client

from jobs.models import ApiToken, Job, JobArray, Membership
from tests.api_helpers import assert_refused

pytestmark = pytest.mark.django_db
SURROGATE = "\\ud800"  # as the body spells it: JSON's escape of a lone surrogate
NUL = "\\u0000"


@pytest.fixture
def user(api) -> Client:
    return api.client


def send(client: Client, url: str, raw: str):
    """`raw` is sent as it is: json.dumps cannot write NaN as a client would."""
    return client.post(f"/api/v1{url}", raw, content_type="application/json")


def job_body(**fields: str) -> str:
    """A submit body with `fields` spliced in as raw JSON."""
    parts = {"entrypoint": '["python", "train.py"]', **fields}
    return "{" + ", ".join(f'"{k}": {v}' for k, v in parts.items()) + "}"


@pytest.mark.parametrize(
    "field, raw",
    [
        ("entrypoint", f'["python", "train.py", "--tag={SURROGATE}"]'),
        ("name", f'"run {SURROGATE}"'),
        ("env", f'{{"TAG": "x{SURROGATE}"}}'),
        ("env", f'{{"T{SURROGATE}": "x"}}'),
        ("cluster", f'"{SURROGATE}"'),
        ("team", f'"{SURROGATE}"'),
        ("window", f'"{SURROGATE}"'),
        ("snapshot", f'"{SURROGATE}"'),
        ("memory", f'"1{SURROGATE}"'),
        ("image", f'"img{SURROGATE}"'),
        ("entrypoint", f'["python", "a{NUL}b"]'),
        ("env", f'{{"TAG": "x{NUL}"}}'),
    ],
)
def test_a_job_whose_text_no_process_can_take_is_refused(user, field, raw):
    fault = "lone surrogates" if SURROGATE in raw else "NUL"
    assert_refused(send(user, "/jobs", job_body(**{field: raw})), 422, field, fault)
    assert not Job.objects.exists()


BAD_PARAMS = {
    "NaN": ('{"lr": NaN}', "lr must be a finite number"),
    "Infinity": ('{"lr": Infinity}', "lr must be a finite number"),
    "-Infinity": ('{"lr": -Infinity}', "lr must be a finite number"),
    "1e400": ('{"lr": 1e400}', "lr must be a finite number"),
    "nested NaN": ('{"grid": [1, {"lr": NaN}]}', "grid[1].lr must be a finite number"),
    "NUL in a value": (f'{{"tag": "a{NUL}b"}}', "tag must not contain NUL"),
    "NUL in a name": (f'{{"ta{NUL}g": "x"}}', "a name must not contain NUL"),
    "surrogate in a value": (f'{{"tag": "{SURROGATE}"}}', "tag must not contain lone surrogates"),
    "surrogate in a name": (f'{{"{SURROGATE}": 1}}', "a name must not contain lone surrogates"),
}


@pytest.mark.parametrize("case", sorted(BAD_PARAMS))
def test_an_array_parameter_no_task_can_take_is_refused(user, case):
    params, sentence = BAD_PARAMS[case]
    body = job_body(array_params=f'[{{"lr": 0.1}}, {params}]')
    assert_refused(send(user, "/arrays", body), 400, "parameter set 2 of the array file", sentence)
    assert not JobArray.objects.exists() and not Job.objects.exists()


@pytest.mark.parametrize("field", ["name", "entrypoint"])
def test_an_array_whose_text_no_process_can_take_is_refused(user, field):
    raw = f'"{SURROGATE}"' if field == "name" else f'["python", "{SURROGATE}"]'
    body = job_body(array='"0-3"', **{field: raw})
    assert_refused(send(user, "/arrays", body), 422, field, "lone surrogates")
    assert not JobArray.objects.exists()


def test_parameters_any_task_can_take_are_kept_as_sent(user):
    params = {"tag": "é 😀 \\n", "lr": 1e308, "steps": 10**30, "grid": [[1, -2.5], {"a": None}]}
    body = job_body(
        entrypoint='["python", "train.py", "--tag={tag}", "--lr={lr}"]',
        array_params=json.dumps([params]),
    )
    response = send(user, "/arrays", body)
    assert response.status_code == 201, response.content
    task = Job.objects.get(array_id=response.json()["id"])
    kept = task.array_params
    assert float(kept.pop("lr")) == 1e308  # PostgreSQL's jsonb gives it back as an integer
    assert kept == {k: v for k, v in params.items() if k != "lr"}
    assert task.entrypoint == ["python", "train.py", "--tag=é 😀 \\n", "--lr=1e+308"]


def test_a_token_name_no_ledger_can_hold_is_refused_by_the_api_and_the_console(alice, user):
    assert_refused(send(user, "/tokens", f'{{"name": "{SURROGATE}"}}'), 422, "lone surrogates")
    console = Client()
    console.force_login(alice)
    page = console.post("/tokens/", {"name": "lap\x00top"})
    assert page.status_code == 200
    assert "a token name must not contain NUL characters" in page.content.decode()
    assert list(ApiToken.objects.values_list("name", flat=True)) == ["cli"]  # the api's


@pytest.mark.parametrize("key", ["status", "team", "user", "backend", "q"])
def test_a_jobs_list_filter_no_name_can_hold_is_400_with_a_sentence(alice, key):
    console = Client()
    console.force_login(alice)
    response = console.get("/", {key: "vi\x00sion"})
    assert response.status_code == 400
    assert response.content.decode() == f"The {key} filter must not contain NUL characters.\n"


def test_the_usage_pages_team_filter_no_name_can_hold_is_400_with_a_sentence(alice):
    console = Client()
    console.force_login(alice)
    response = console.get("/usage/", {"team": "vi\x00sion"})
    assert response.status_code == 400
    assert response.content.decode() == "The team filter must not contain NUL characters.\n"


@pytest.mark.parametrize(
    "path, form, sentence",
    [
        ("members/", {"username": "bo\x00b", "role": "member"}, "a user name must not"),
        ("members/bo%00b/role/", {"role": "member"}, "a user name must not"),
        ("members/bo%00b/remove/", {}, "a user name must not"),
        ("defaults/", {"default_cluster": "lo\x00cal"}, "a cluster name must not"),
        ("defaults/", {"window": "ni\x00ghts"}, "a schedule window name must not"),
    ],
)
def test_a_team_form_with_a_name_no_ledger_can_hold_says_so(alice, team, path, form, sentence):
    Membership.objects.filter(user=alice, team=team).update(role="admin")
    console = Client()
    console.force_login(alice)
    page = console.post(f"/teams/{team.name}/{path}", form, follow=True)
    assert page.status_code == 200
    assert f"{sentence} contain NUL characters" in page.content.decode()
