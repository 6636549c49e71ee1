"""The console in a real browser (Debian's Chromium driven by Playwright) against the real stack.

Screenshots of every tab land in test-artifacts/ for a person to look at.
"""

import time
from pathlib import Path

import pytest

from tests.browser.pages import sign_in, submit
from tests.browser.shots import ARTIFACTS
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e
TICKER = """
import time
import sf
for i in range(2000):
    print(f"tick {i} {time.time():.3f}", flush=True)
    sf.log({"loss": 1.0 / (i + 1)}, step=i)
    time.sleep(0.25)
"""


@pytest.fixture
def page(browser, stack, carol_token):
    context = browser.new_context(base_url=stack.url)
    page = context.new_page()
    sign_in(page, stack.url, "carol", "carol-pw")
    yield page
    context.close()


def test_running_job_streams_logs_draws_charts_and_pauses_without_reload(
    page, stack, carol_token, tmp_path
):
    (tmp_path / "ticker.py").write_text(TICKER)
    job_id = submit(stack, carol_token, tmp_path, "python", "ticker.py")
    _wait_running(stack, job_id)
    page.goto(f"/jobs/{job_id}/#logs")
    page.evaluate("""() => {
        window.sfArrivals = [];
        window.sfNotReloaded = true;
        new MutationObserver((records) => {
            for (const r of records) for (const n of r.addedNodes) {
                const m = /^tick \\d+ (\\d+\\.\\d+)$/.exec(n.textContent || "");
                if (m) window.sfArrivals.push(Date.now() / 1000 - parseFloat(m[1]));
            }
        }).observe(document.querySelector("#tab-logs"), {childList: true, subtree: true});
    }""")
    page.wait_for_function("() => window.sfArrivals.length >= 1", timeout=15000)
    page.wait_for_timeout(2000)  # the tail and the catch-up fetch after connecting are history
    page.evaluate("() => { window.sfArrivals = []; }")
    page.wait_for_function("() => window.sfArrivals.length >= 8", timeout=15000)
    delays = page.evaluate("() => window.sfArrivals")
    assert max(delays) < 1.0, delays  # each line shown within a second of being written
    page.screenshot(path=str(_artifact("logs.png")))
    page.goto(f"/jobs/{job_id}/#charts")
    page.wait_for_selector('#tab-charts [data-metric="loss"] .main-svg', timeout=15000)
    page.screenshot(path=str(_artifact("charts.png")))
    for tab in ("validation", "system", "events", "diagnostics"):
        page.click(f'nav.tabs a[href="#{tab}"]')
        page.wait_for_selector(f"#tab-{tab}", state="visible")
        page.screenshot(path=str(_artifact(f"{tab}.png")))
    page.evaluate("() => { window.sfNotReloaded = true; }")
    page.click('.actions button[value="pause"]')
    page.wait_for_function(
        "() => document.querySelector('.job-head [data-job-status]').textContent === 'PAUSED'",
        timeout=10000,
    )
    assert page.evaluate("() => window.sfNotReloaded") is True
    page.screenshot(path=str(_artifact("paused.png")))


def test_another_teams_job_is_a_404(page, stack, tmp_path):
    (tmp_path / "noop.py").write_text("print('demo job')\n")
    demo_job = submit(stack, stack.token, tmp_path, "python", "noop.py")
    response = page.goto(f"/jobs/{demo_job}/")
    assert response.status == 404


def _wait_running(stack: Stack, job_id: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if stack.job(job_id)["status"] == "RUNNING":
            return
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not start:\n{stack.diagnostics()}")


def _artifact(name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name
