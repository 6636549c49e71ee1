"""Quotas and usage in a real browser (Debian's Chromium driven by Playwright) on the real stack.

A staff user changes team nlp's quota and slots in the Django admin and a member watches their
waiting job leave QUEUED on its page; a member's finished job shows on the usage page's stacked
chart. Screenshots land in test-artifacts/ for a person to look at.
"""

import json
import re
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.browser.pages import sign_in, submit
from tests.browser.shots import ARTIFACTS
from tests.e2e.stack import Stack, live_runners, wait_until

pytestmark = pytest.mark.e2e
SETUP_TEAM = """
import json
from django.contrib.auth.models import User
from jobs.actions.tokens import issue_token
from jobs.models import Cluster, Membership, Team
team = Team.objects.create(name="nlp", gpu_quota=1,
                           default_cluster=Cluster.objects.get(name="local"))
User.objects.create_superuser("olga", password="olga-pw")
tokens = {}
for name in ("nina", "omar"):
    user = User.objects.create_user(name, password=f"{name}-pw")
    Membership.objects.create(team=team, user=user)
    tokens[name] = issue_token(user)
print(json.dumps({"team": team.pk, **tokens}))
"""
SLEEPER = "import time\ntime.sleep(120)\n"
QUOTA_WAIT = "waiting for quota: team nlp uses 1 of 1 GPUs; this job needs 1"
SLOT_WAIT = "waiting for a slot: team nlp runs 2 of the 2 jobs it may run at once"
HOLDING = ("SUBMITTED", "PENDING", "RUNNING")  # admitted: the job holds quota
USAGE_CHART = "#usage-chart"


@pytest.fixture(scope="module")
def nlp(stack) -> dict:
    """Team nlp (quota 1 GPU) with members nina and omar, and staff superuser olga."""
    return json.loads(stack._manage("shell", "-c", SETUP_TEAM).stdout.strip().splitlines()[-1])


@pytest.fixture
def open_page(browser, stack):
    """Open a page in a fresh browser context (its own cookies) per call."""
    contexts = []

    def open_() -> Page:
        contexts.append(browser.new_context(base_url=stack.url))
        return contexts[-1].new_page()

    yield open_
    for context in contexts:
        context.close()


@pytest.fixture
def stop_at_end(stack):
    """Job ids to stop once the test is over, passed or not, so nothing is left running."""
    job_ids: list[int] = []
    yield job_ids
    for job_id in job_ids:
        job = stack.job(job_id)
        if job["status"] in (*HOLDING, "QUEUED"):
            assert _post(stack, f"/jobs/{job_id}/stop")["status"] == "STOPPED"
        wait_until(
            lambda run_id=job["run_id"]: not live_runners(run_id),
            30,
            f"job {job_id}'s processes to end",
            stack.diagnostics,
        )


def test_raising_the_team_quota_in_the_admin_admits_the_waiting_job(
    stack, nlp, open_page, stop_at_end, tmp_path
):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    first = submit(stack, nlp["nina"], tmp_path, "python", "sleeper.py")
    stop_at_end.append(first)
    stack.wait_job(first, lambda job: job["status"] == "RUNNING", 60, "running")
    second = submit(stack, nlp["nina"], tmp_path, "python", "sleeper.py")
    stop_at_end.append(second)
    stack.wait_job(second, lambda job: job["status_reason"] == QUOTA_WAIT, 30, "quota wait")

    nina = open_page()
    sign_in(nina, stack.url, "nina", "nina-pw")
    nina.goto("/?team=nlp")
    row = nina.locator(f'tr[data-job-id="{second}"]')
    expect(row.locator("[data-job-status]")).to_have_text("QUEUED")
    expect(row.locator("td.reason")).to_have_text(QUOTA_WAIT)
    nina.goto(f"/jobs/{second}/")
    expect(nina.locator(".job-head [data-job-status]")).to_have_text("QUEUED")
    expect(nina.locator(".job-head pre.reason")).to_have_text(QUOTA_WAIT)
    nina.screenshot(path=str(_artifact("quota-waiting.png")))
    _wait_live(nina, second)  # a status pushed before the socket is open would be missed

    olga = open_page()
    _admin_sign_in(olga)
    _edit_team(olga, nlp["team"], {"#id_gpu_quota": "2"}, "admin-quota.png")
    nina.wait_for_function(
        "() => document.querySelector('.job-head [data-job-status]').textContent !== 'QUEUED'",
        timeout=30000,
    )
    nina.reload()
    expect(nina.locator(".job-head [data-job-status]")).to_have_text(
        re.compile(f"^({'|'.join(HOLDING)})$")
    )
    expect(nina.locator(".job-head pre.reason")).not_to_have_text(QUOTA_WAIT)
    nina.screenshot(path=str(_artifact("quota-admitted.png")))

    _edit_team(olga, nlp["team"], {"#id_gpu_quota": "3", "#id_max_jobs": "2"}, "admin-slots.png")
    third = submit(stack, nlp["nina"], tmp_path, "python", "sleeper.py")
    stop_at_end.append(third)
    stack.wait_job(third, lambda job: job["status_reason"] == SLOT_WAIT, 30, "slot wait")
    nina.goto(f"/jobs/{third}/")
    expect(nina.locator(".job-head [data-job-status]")).to_have_text("QUEUED")
    expect(nina.locator(".job-head pre.reason")).to_have_text(SLOT_WAIT)
    nina.screenshot(path=str(_artifact("slot-waiting.png")))


def test_usage_page_stacks_a_finished_jobs_gpu_hours_by_team(stack, nlp, open_page, tmp_path):
    (tmp_path / "short.py").write_text("import time\ntime.sleep(3)\n")
    job_id = submit(stack, nlp["omar"], tmp_path, "python", "short.py")
    stack.wait_job(job_id, lambda job: job["status"] == "SUCCEEDED", 60, "succeeded")
    wait_until(
        lambda: _usage_of(stack, nlp["omar"], "omar"),
        30,
        "omar's GPU time in /api/v1/usage",
        stack.diagnostics,
        0.5,
    )

    omar = open_page()
    sign_in(omar, stack.url, "omar", "omar-pw")
    omar.goto("/usage/")
    omar.wait_for_selector(f"{USAGE_CHART}.js-plotly-plot .barlayer .bars path", timeout=15000)
    chart = omar.evaluate(
        """(selector) => {
            const plot = document.querySelector(selector);
            const nlp = plot.data.find((trace) => trace.name === "nlp");
            return {barmode: plot.layout.barmode, type: nlp && nlp.type, y: nlp ? nlp.y : []};
        }""",
        USAGE_CHART,
    )
    assert chart["barmode"] == "stack", chart
    assert chart["type"] == "bar", chart
    assert any(y > 0 for y in chart["y"]), chart
    by_team = omar.locator("h2:text-is('By team') + table tbody tr")
    expect(by_team.filter(has_text="nlp")).to_have_count(1)
    by_user = omar.locator("h2:text-is('By user') + table tbody tr")
    expect(by_user.filter(has_text="omar")).to_have_count(1)
    omar.screenshot(path=str(_artifact("usage.png")), full_page=True)


def _admin_sign_in(page: Page) -> None:
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", "olga")
    page.fill("#id_password", "olga-pw")
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/")


def _edit_team(page: Page, team_id: int, fields: dict[str, str], screenshot: str) -> None:
    """Open team nlp from the admin's team list, fill `fields` (selector: value) and save."""
    page.goto("/admin/jobs/team/")
    page.click("#result_list a:text-is('nlp')")
    page.wait_for_url(f"**/admin/jobs/team/{team_id}/change/")
    for selector, value in fields.items():
        page.fill(selector, value)
    page.screenshot(path=str(_artifact(screenshot)))
    page.click("input[name=_save]")
    page.wait_for_url("**/admin/jobs/team/")
    expect(page.locator(".messagelist .success")).to_contain_text("was changed successfully")


def _wait_live(page: Page, job_id: int) -> None:
    page.wait_for_function(
        f"() => window.StarforgeLive.socket('/ws/jobs/{job_id}/').state === 'open'",
        timeout=10000,
    )


def _usage_of(stack: Stack, token: str, username: str) -> bool:
    usage = _request(stack, "GET", "/usage?team=nlp&by=user", token)
    return any(row["user"] == username and row["gpu_seconds"] > 0 for row in usage["rows"])


def _post(stack: Stack, path: str) -> dict:
    return _request(stack, "POST", path, stack.token)


def _request(stack: Stack, method: str, path: str, token: str) -> dict:
    request = urllib.request.Request(
        f"{stack.url}/api/v1{path}", method=method, headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def _artifact(name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name
