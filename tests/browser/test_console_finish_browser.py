"""The console's finish in a real browser (Debian's Chromium driven by Playwright) against the
real stack: the jobs list's Duration and GPU-hours, absolute times on hover, the light/dark
theme and its toggle, and the job page's keyboard tabs.

Each test saves a screenshot (tests/browser/conftest.py `shoot`): in test-artifacts/ among others.
"""

import datetime as dt
import json
import re
import time
import urllib.request

import pytest
from playwright.sync_api import Page, expect

from tests.browser.pages import DARK_FG, LIGHT_FG, submit
from tests.browser.shots import shoot

pytestmark = pytest.mark.e2e
SHORT_RUN = """
import time
import sf
for step in range(3):
    sf.log({"loss": 1.0 / (step + 1)}, step=step)
time.sleep(2.5)
"""
DARK_BG, LIGHT_BG = "rgb(20, 23, 29)", "rgb(255, 255, 255)"
UTC_TITLE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


@pytest.fixture(scope="module")
def finished(stack, carol_token, tmp_path_factory) -> int:
    """A job of carol's that logged a few metric points and succeeded after a few seconds."""
    workdir = tmp_path_factory.mktemp("short")
    (workdir / "short.py").write_text(SHORT_RUN)
    job_id = submit(stack, carol_token, workdir, "python", "short.py")
    stack.wait_job(job_id, lambda job: job["status"] == "SUCCEEDED", 90, "succeeded")
    return job_id


def background(page: Page) -> str:
    return page.evaluate("() => getComputedStyle(document.body).backgroundColor")


def test_jobs_list_shows_duration_and_gpu_hours_of_a_finished_job(
    open_page, stack, finished, tmp_path
):
    page = open_page()
    page.goto("/")
    row = page.locator(f'tr[data-job-id="{finished}"]')
    expect(row.locator("[data-job-status]")).to_have_text("SUCCEEDED")
    expect(page.locator("table.jobs thead th")).to_contain_text(["Duration", "GPU-hours"])
    duration = row.locator("td.duration").inner_text()
    assert re.fullmatch(r"\d\d:\d\d:\d\d", duration), duration
    h, m, s = map(int, duration.split(":"))
    ran = h * 3600 + m * 60 + s
    assert 2 <= ran < 120, duration  # it slept 2.5 s
    cell = row.locator("td.gpu-hours")
    hours = cell.inner_text()
    assert re.fullmatch(r"\d+\.\d{2,3}", hours) and float(hours) > 0, hours
    gpu_seconds = float(cell.get_attribute("title").split()[0])  # 1 GPU, one attempt
    assert ran <= gpu_seconds < ran + 1.5, (duration, gpu_seconds)
    page.wait_for_timeout(1500)  # a finished job's cells stay put (durations.js)
    assert row.locator("td.duration").inner_text() == duration
    shoot(page, tmp_path, "list-duration-gpu-hours.png")


def test_a_running_rows_duration_counts_on_and_stops_when_the_list_hears_it_ended(
    open_page, stack, carol_token, tmp_path
):
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(120)\n")
    job_id = submit(stack, carol_token, tmp_path, "python", "sleeper.py")
    try:
        stack.wait_job(job_id, lambda job: job["status"] == "RUNNING", 60, "running")
        page = open_page()
        page.goto("/")
        page.wait_for_function(
            "() => window.StarforgeLive.socket('/ws/jobs/').state === 'open'", timeout=10000
        )
        row = page.locator(f'tr[data-job-id="{job_id}"]')
        expect(row.locator("td.duration")).to_have_attribute("data-state", "running")
        first = row.locator("td.duration").inner_text()
        expect(row.locator("td.duration")).not_to_have_text(first, timeout=5000)  # it ticks
        shoot(page, tmp_path, "list-running.png")
    finally:
        request = urllib.request.Request(
            f"{stack.url}/api/v1/jobs/{job_id}/stop",
            method="POST",
            data=b"{}",
            headers={"Authorization": f"Bearer {carol_token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert json.load(answer)["status"] == "STOPPED"
    expect(row.locator("[data-job-status]")).to_have_text("STOPPED", timeout=15000)  # no reload
    expect(row.locator("td.duration")).to_have_attribute("data-state", "ran")
    stopped = row.locator("td.duration").inner_text()
    assert re.fullmatch(r"\d\d:\d\d:\d\d", stopped), stopped
    assert row.locator("td.gpu-hours").get_attribute("data-open-start") is None
    page.wait_for_timeout(2000)
    assert row.locator("td.duration").inner_text() == stopped  # no longer counting
    shoot(page, tmp_path, "list-stopped-live.png")


def test_relative_times_give_the_absolute_utc_time_on_hover(open_page, stack, finished, tmp_path):
    page = open_page()
    page.goto("/")
    submitted = page.locator(f'tr[data-job-id="{finished}"] time')
    expect(submitted).to_have_text(re.compile(r"^\d+ (s|min|h|day) ago$"))
    submitted.hover()
    at = dt.datetime.fromisoformat(stack.job(finished)["submitted_at"]).astimezone(dt.UTC)
    assert submitted.get_attribute("title") == f"{at:%Y-%m-%d %H:%M:%S} UTC"
    shoot(page, tmp_path, "list-time-hover.png")
    page.goto(f"/jobs/{finished}/#events")
    times = page.locator("#tab-events time")
    expect(times.first).to_have_text(re.compile(r" ago$"))
    assert times.count() >= 4  # the attempt's submit, start and end, and the events
    for title in times.evaluate_all("(els) => els.map((el) => el.title)"):
        assert UTC_TITLE.fullmatch(title), title
    times.first.hover()
    shoot(page, tmp_path, "events-time-hover.png")


def test_theme_toggle_cycles_system_light_dark_and_survives_reload(open_page, finished, tmp_path):
    page = open_page("light")
    page.goto(f"/jobs/{finished}/#charts")
    toggle = page.locator("header [data-theme-toggle]")
    expect(toggle).to_have_text("Theme: system")
    assert page.evaluate("() => document.documentElement.dataset.theme") is None
    assert background(page) == LIGHT_BG
    chart = page.locator('#tab-charts [data-metric="loss"]')
    expect(chart.locator(".main-svg").first).to_be_visible(timeout=15000)
    chart_font = "(el) => el._fullLayout.font.color"
    assert chart.evaluate(chart_font) == LIGHT_FG
    toggle.click()
    expect(page.locator("html")).to_have_attribute("data-theme", "light")
    toggle.click()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    expect(toggle).to_have_text("Theme: dark")
    assert background(page) == DARK_BG
    page.wait_for_function(
        f"(el) => el._fullLayout.font.color === '{DARK_FG}'", arg=chart.element_handle()
    )
    shoot(page, tmp_path, "theme-dark-toggled.png")
    # Kept in localStorage and applied by the inline script in <head>, before theme.js (not
    # loaded here) or the first paint.
    page.route("**/static/js/theme.js", lambda route: route.abort())
    page.reload()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    assert background(page) == DARK_BG
    page.unroute("**/static/js/theme.js")
    page.goto("/")
    expect(toggle).to_have_text("Theme: dark")
    toggle.click()  # back to the system's (light) setting
    assert page.evaluate("() => document.documentElement.dataset.theme") is None
    assert page.evaluate("() => localStorage.getItem('sf-theme')") is None
    assert background(page) == LIGHT_BG
    shoot(page, tmp_path, "theme-system-again.png")


def test_a_dark_system_setting_gives_the_dark_theme_by_default(open_page, finished, tmp_path):
    page = open_page("light")
    page.emulate_media(color_scheme="dark")
    page.goto("/")
    assert page.evaluate("() => document.documentElement.dataset.theme") is None
    assert background(page) == DARK_BG
    expect(page.locator("header [data-theme-toggle]")).to_have_text("Theme: system")
    shoot(page, tmp_path, "theme-system-dark.png")
    page.locator("header [data-theme-toggle]").click()  # light, whatever the system says
    assert background(page) == LIGHT_BG
    page.emulate_media(color_scheme="light")
    page.emulate_media(color_scheme="dark")
    assert background(page) == LIGHT_BG


def test_job_page_tabs_are_reachable_and_switched_from_the_keyboard(open_page, finished, tmp_path):
    page = open_page()
    page.goto(f"/jobs/{finished}/")

    def selected() -> tuple[str, str, str, str]:
        return tuple(
            page.evaluate("""() => [
            document.querySelector('[role=tab][aria-selected=true]').id,
            [...document.querySelectorAll('[role=tabpanel]')].filter((p) => !p.hidden)
                .map((p) => p.id).join(),
            document.activeElement.id,
            location.hash,
        ]""")
        )

    def settles(*expected: str) -> None:
        """The page reaches `expected` (a prefix of `selected()`) within 5 s: key and click
        handlers run in the page's own time."""
        deadline = time.monotonic() + 5
        while selected()[: len(expected)] != expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert selected()[: len(expected)] == expected

    page.focus("#tablink-charts")
    assert selected() == ("tablink-charts", "tab-charts", "tablink-charts", "")
    page.keyboard.press("ArrowRight")
    settles("tablink-logs", "tab-logs", "tablink-logs", "#logs")
    outline = page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle")
    assert outline == "solid"  # the focus is visible
    assert page.get_attribute("#tablink-charts", "tabindex") == "-1"  # roving tabindex
    assert page.get_attribute("#tablink-logs", "tabindex") == "0"
    shoot(page, tmp_path, "tabs-arrow-right.png")
    page.keyboard.press("End")
    settles("tablink-diagnostics", "tab-diagnostics", "tablink-diagnostics", "#diagnostics")
    shoot(page, tmp_path, "tabs-end.png")
    page.keyboard.press("ArrowRight")  # wraps round
    settles("tablink-charts", "tab-charts")
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("Home")
    settles("tablink-charts", "tab-charts")
    page.keyboard.press("Tab")  # from the tab list into the open panel, not the next tab
    deadline = time.monotonic() + 5
    while selected()[2] != "tab-charts" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert selected()[2] == "tab-charts"
    # Links to a tab and clicks work as before: the Events tab opens from its hash.
    page.goto(f"/jobs/{finished}/#events")
    settles("tablink-events", "tab-events")
    page.click("#tablink-validation")
    settles("tablink-validation", "tab-validation")
