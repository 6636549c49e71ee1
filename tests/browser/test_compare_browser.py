"""The compare page in a real browser (Debian's Chromium driven by Playwright) against the real
stack: two jobs that logged metrics through the SDK overlaid on one chart per metric, and the
jobs list's checkboxes and "Compare selected" landing on the page's URL.

Each test saves a screenshot (tests/browser/conftest.py `shoot`): in test-artifacts/ among others.
"""

import pytest
from playwright.sync_api import expect

from tests.browser.pages import DARK_FG, LIGHT_FG, submit
from tests.browser.shots import shoot

pytestmark = pytest.mark.e2e
# Logs a loss and an accuracy for a few steps; the learning rate comes from argv, so the two
# jobs differ in their entrypoint.
SWEEP_RUN = """
import sys
import sf
lr = float(sys.argv[1])
for step in range(5):
    sf.log({"loss": 2.0 / (1 + lr * 10 * step), "accuracy": lr * step}, step=step)
"""


@pytest.fixture(scope="module")
def two_runs(stack, carol_token, tmp_path_factory) -> list[dict]:
    """Two of carol's jobs, lr 0.1 and 0.05, that logged their metrics and succeeded."""
    workdir = tmp_path_factory.mktemp("sweep")
    (workdir / "sweep.py").write_text(SWEEP_RUN)
    ids = [submit(stack, carol_token, workdir, "python", "sweep.py", lr) for lr in ("0.1", "0.05")]
    return [
        stack.wait_job(job_id, lambda job: job["status"] == "SUCCEEDED", 90, "succeeded")
        for job_id in ids
    ]


def test_the_compare_page_overlays_both_jobs_on_each_chart(open_page, two_runs, tmp_path):
    a, b = two_runs
    page = open_page()
    page.goto(f"/compare/?jobs={a['id']},{b['id']}")
    loss = page.locator('#compare-charts [data-metric="loss"]')
    expect(loss.locator(".main-svg").first).to_be_visible(timeout=15000)
    names = [f"job {a['id']} · {a['name']}", f"job {b['id']} · {b['name']}"]
    assert loss.evaluate("(el) => el.data.map((t) => t.name)") == names
    assert loss.evaluate("(el) => el.data.map((t) => t.y.length)") == [5, 5]
    expect(loss.locator(".legendtext")).to_have_text(names)
    expect(page.locator('#compare-charts [data-metric="accuracy"] .legendtext')).to_have_text(names)
    assert loss.evaluate("(el) => el._fullLayout.font.color") == LIGHT_FG  # the theme's --fg
    # The table: a's loss ends at 2 / (1 + 4) = 0.4, its best (min) too; accuracy 0.4 (max).
    row = page.locator(f'#compare-values tr[data-job-id="{a["id"]}"]')
    expect(row.locator("td.final")).to_have_text(["0.4", "0.4"])
    expect(page.locator("#compare-params")).to_contain_text("entrypoint")
    expect(page.locator("#compare-params")).to_contain_text("python sweep.py 0.05")
    shoot(page, tmp_path, "compare-two-jobs.png")
    page.select_option("#compare-x select.x-axis", "time")  # reloads with ?x=time
    page.wait_for_url(f"**/compare/?jobs={a['id']},{b['id']}&x=time")
    expect(loss.locator(".main-svg").first).to_be_visible(timeout=15000)
    assert loss.evaluate("(el) => el.data.map((t) => t.x[0])") == [0, 0]
    shoot(page, tmp_path, "compare-two-jobs-time.png")


def test_the_charts_follow_the_dark_theme(open_page, two_runs, tmp_path):
    a, b = two_runs
    page = open_page("dark")
    page.goto(f"/compare/?jobs={a['id']},{b['id']}")
    loss = page.locator('#compare-charts [data-metric="loss"]')
    expect(loss.locator(".main-svg").first).to_be_visible(timeout=15000)
    assert loss.evaluate("(el) => el._fullLayout.font.color") == DARK_FG
    shoot(page, tmp_path, "compare-dark.png")


def test_selecting_two_rows_and_pressing_compare_opens_their_page(
    open_page, stack, two_runs, tmp_path
):
    a, b = two_runs
    page = open_page()
    page.goto("/")
    page.check(f'tr[data-job-id="{a["id"]}"] input.compare-pick')
    page.click("#compare-form button[type=submit]")
    expect(page.locator("[data-compare-status]")).to_have_text("1 selected: pick 2 to 20")
    assert page.url == f"{stack.url}/"  # one job: nowhere to go yet
    page.focus(f'tr[data-job-id="{b["id"]}"] input.compare-pick')  # the keyboard works too
    page.keyboard.press("Space")
    expect(page.locator("[data-compare-status]")).to_have_text("2 selected")
    shoot(page, tmp_path, "list-two-selected.png")
    page.click("#compare-form button[type=submit]")
    page.wait_for_url(f"{stack.url}/compare/?jobs={b['id']},{a['id']}")  # the list's order
    expect(page.locator('#compare-charts [data-metric="loss"] .main-svg').first).to_be_visible(
        timeout=15000
    )
    shoot(page, tmp_path, "compare-from-list.png")
