"""The first console pages: sign-in, the jobs list and a job page, limited to the user's teams."""

import datetime as dt

import pytest
from django.test import Client
from django.utils import timezone

from jobs.models import Job
from jobs.states import VERBS, JobStatus
from jobs.stores import logstore
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_pages_need_a_signed_in_user():
    assert Client().get("/").url.startswith("/accounts/login/")
    assert Client().get("/accounts/login/").status_code == 200


def test_sign_in_with_password_reaches_the_jobs_list(alice):
    client = Client()
    response = client.post("/accounts/login/", {"username": "alice", "password": "pw"})
    assert response.status_code == 302
    assert "Jobs" in client.get("/").content.decode()


def test_jobs_list_and_job_page_show_only_my_teams(team, alice, make_team, make_user):
    mine = queued_job(team, alice, name="my-run")
    other_team = make_team("nlp")
    theirs = queued_job(other_team, make_user("bob", other_team), name="their-run")
    client = signed_in(alice)
    page = client.get("/").content.decode()
    assert "my-run" in page and "their-run" not in page
    assert client.get(f"/jobs/{mine.pk}/").status_code == 200
    assert client.get(f"/jobs/{theirs.pk}/").status_code == 404


# -- the job page, its tabs and buttons ------------------------------------------------------

TABS = ["tab-charts", "tab-logs", "tab-validation", "tab-system", "tab-events", "tab-diagnostics"]
BUTTONS = {
    "QUEUED": {"stop", "pause"},
    "SUBMITTED": {"stop", "pause"},
    "PENDING": {"stop", "pause"},
    "RUNNING": {"stop", "pause"},
    "PAUSED": {"stop", "resume"},
    "FAILED": {"stop", "retry"},
    "STOPPED": {"retry"},
    "SUCCEEDED": set(),
}
SAYS = {
    "QUEUED": "Waiting to be admitted",
    "SUBMITTED": "being launched",
    "PENDING": "not running yet",
    "RUNNING": "Running since",
    "SUCCEEDED": "Exited with code 0",
    "FAILED": "failed: the entrypoint",
    "STOPPED": "retry",
    "PAUSED": "Paused",
}


def job_in(status: str, team, user) -> Job:
    job = queued_job(team, user, name=f"job-{status.lower()}")
    if status == "QUEUED":
        return job
    now = timezone.now()
    ended = status in ("SUCCEEDED", "FAILED", "STOPPED", "PAUSED")
    with_attempt(
        job,
        status,
        job_ref="ref-1",
        pending_at=now,
        start_time=None if status in ("SUBMITTED", "PENDING") else now,
        end_time=now + dt.timedelta(seconds=5) if ended else None,
        exit_code={"SUCCEEDED": 0, "FAILED": 3}.get(status),
        failure="exit" if status == "FAILED" else "",
    )
    logstore.append(job.pk, 1, [{"seq": 0, "stream": "stderr", "ts": 1.0, "text": "boom <b>"}])
    return Job.objects.get(pk=job.pk)


@pytest.mark.parametrize("status", JobStatus.values)
def test_job_page_renders_every_tab_in_every_state(status, team, alice):
    job = job_in(status, team, alice)
    page = signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert all(f'id="{tab}"' in page for tab in TABS)
    assert f">{status}</a>" in page  # the badge, linked to the states help
    assert SAYS[status] in page  # Diagnostics explains the state
    shown = {verb for verb in ("stop", "pause", "resume", "retry") if f'value="{verb}"' in page}
    assert shown == BUTTONS[status]
    assert f'data-logs-socket="/ws/jobs/{job.pk}/"' in page  # the live Logs tab


def test_retry_button_is_disabled_with_the_reason_when_the_snapshot_is_gone(api, team, alice):
    from jobs.models import Snapshot
    from tests.api_helpers import upload_snapshot

    sha = upload_snapshot(api)
    Snapshot.objects.filter(pk=sha).update(deleted_reason="with `prune_snapshots`")
    job = job_in("FAILED", team, alice)
    Job.objects.filter(pk=job.pk).update(snapshot_id=sha)
    from jobs.stores.snapshots import snapshot_path

    snapshot_path(sha).unlink()
    page = signed_in(alice).get(f"/jobs/{job.pk}/").content.decode()
    assert 'value="retry" disabled title="the working-directory snapshot was deleted with' in page


def test_buttons_post_with_csrf_and_call_the_same_action(team, alice):
    job = job_in("RUNNING", team, alice)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.post(f"/jobs/{job.pk}/pause/").status_code == 403  # no CSRF token
    client.get(f"/jobs/{job.pk}/")
    token = client.cookies["csrftoken"].value
    response = client.post(f"/jobs/{job.pk}/pause/", {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert Job.objects.get(pk=job.pk).status == "PAUSED"
    refused = client.post(f"/jobs/{job.pk}/pause/", {"csrfmiddlewaretoken": token}, follow=True)
    assert "a PAUSED job cannot become PAUSED" in refused.content.decode()


def test_actions_on_another_teams_job_are_404(team, alice, make_team, make_user):
    other = make_team("nlp")
    job = job_in("RUNNING", other, make_user("bob", other))
    assert signed_in(alice).post(f"/jobs/{job.pk}/stop/").status_code == 404
    assert Job.objects.get(pk=job.pk).status == "RUNNING"


def test_jobs_list_filters_and_pages_by_keyset(team, alice):
    for n in range(55):
        queued_job(team, alice, name=f"sweep-{n}")
    client = signed_in(alice)
    first = client.get("/").content.decode()
    assert "sweep-54" in first and "sweep-4<" not in first and "Older jobs" in first
    oldest = Job.objects.order_by("pk")[5].pk
    second = client.get(f"/?before={oldest + 1}").content.decode()
    assert "sweep-5<" in second and "sweep-0<" in second and "Older jobs" not in second
    assert "sweep-3<" in client.get("/?q=sweep-3").content.decode()
    assert "sweep" not in client.get("/?status=RUNNING").content.decode().split("<tbody>")[1]


def test_states_page_explains_every_state_and_plotly_is_served_locally(alice):
    client = signed_in(alice)
    page = client.get("/states/").content.decode()
    assert all(f'id="{s}"' in page for s in JobStatus.values)
    bundle = client.get("/static/vendor/plotly.min.js")
    assert bundle.status_code == 200


def test_states_page_lists_each_verb_with_the_states_the_table_allows_it_from(alice):
    page = signed_in(alice).get("/states/").content.decode()
    assert '<tr id="verb-resume"><td>resume</td><td>QUEUED</td><td>PAUSED</td></tr>' in page
    assert (
        '<tr id="verb-stop"><td>stop</td><td>STOPPED</td>'
        "<td>QUEUED, SUBMITTED, PENDING, RUNNING, FAILED, PAUSED</td></tr>"
    ) in page
    assert all(f'id="verb-{verb}"' in page for verb in VERBS)


def test_buttons_answer_json_to_the_page_script(team, alice):
    job = job_in("RUNNING", team, alice)
    client = signed_in(alice)
    answer = client.post(f"/jobs/{job.pk}/pause/", HTTP_ACCEPT="application/json")
    assert answer.status_code == 200 and answer.json()["status"] == "PAUSED"
    again = client.post(f"/jobs/{job.pk}/pause/", HTTP_ACCEPT="application/json")
    assert again.status_code == 409 and "job" in again.json()["detail"]


def test_jobs_list_sorts_oldest_first_on_request_and_pages_forward(team, alice):
    jobs = [queued_job(team, alice, name=f"run-{n}") for n in range(52)]
    client = signed_in(alice)
    page = client.get("/?order=oldest").content.decode()
    assert page.index("run-0<") < page.index("run-1<") and "run-51<" not in page
    rest = client.get(f"/?order=oldest&after={jobs[49].pk}").content.decode()
    assert "run-50<" in rest and "run-51<" in rest and "run-49<" not in rest


def test_validation_tab_lists_follow_on_jobs_for_their_metrics(team, alice):
    parent = job_in("SUCCEEDED", team, alice)
    child = queued_job(team, alice, parent=parent, follow_on_name="eval")
    page = signed_in(alice).get(f"/jobs/{parent.pk}/").content.decode()
    assert (
        f'data-follow-ons="[{{&quot;id&quot;: {child.pk}, &quot;name&quot;: &quot;eval&quot;}}]"'
        in page
    )
