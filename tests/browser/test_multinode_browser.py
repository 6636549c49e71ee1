"""A multi-node job's page in a real browser (Debian's Chromium driven by Playwright) on the real
stack: nodes × GPUs and the ranks table, the Logs tab's rank marks and rank filter (history and
live lines pushed over the job's websocket by `logstore.append`), and the System tab's group per
rank titled with the rank and its node.

The job's ledger rows, log lines and system points are written directly in the stack's ledger
(`manage.py shell`), on a disabled cluster that nothing polls, so the reconciler never changes
the ranks the page is checked against. Screenshots land in test-artifacts/.
"""

import json
import time
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.browser.pages import sign_in
from tests.browser.shots import ARTIFACTS
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e
NODES = {0: "gpu-a1", 1: "gpu-b12"}
# Rank 0 exited 0 (a falsy exit code must still show), rank 1 failed with 3.
RANKS = [
    {"rank": 0, "node": NODES[0], "state": "succeeded", "exit_code": 0},
    {"rank": 1, "node": NODES[1], "state": "failed", "exit_code": 3},
]
HISTORY = [0, 1, 1, 0, 1, 0]  # the rank of each stored line, seq 0..5
# Each rank's system series (steps 1..3); nvml_available is a flag, not a chart.
SYSTEM = {
    0: {"cpu_percent": [11.0, 12.0, 13.0], "memory_mib": [100.0, 110.0, 120.0]},
    1: {"cpu_percent": [71.0, 72.0, 73.0], "memory_mib": [700.0, 710.0, 720.0]},
}
SETUP_GANG = """
import datetime as dt
import json
from django.contrib.auth.models import User
from django.utils import timezone
from jobs.models import Attempt, Cluster, Job, Membership, Team
from jobs.stores import logstore
from jobs.stores.metrics import ingest
spec = json.loads(SPEC)
team = Team.objects.create(name="hpc", gpu_quota=16,
                           default_cluster=Cluster.objects.get(name="local"))
dana = User.objects.create_user("dana", password="dana-pw")
Membership.objects.create(team=team, user=dana)
# The reconciler polls enabled clusters only: on this one the ranks stay as written here.
gangs = Cluster.objects.create(name="gangs", kind="noop", enabled=False)
now = timezone.now()
job = Job.objects.create(
    run_id="gang000001", name="allreduce", team=team, user=dana, cluster=gangs, total_gpus=8,
    nodes=2, gpu_type="a100", entrypoint=["python", "allreduce.py"], status="FAILED",
    status_reason="rank 1 failed with exit code 3", status_changed_at=now,
    submitted_at=now - dt.timedelta(minutes=2), attempt_count=1,
)
attempt = Attempt.objects.create(
    job=job, number=1, total_gpus=8, nodes=2, ranks=spec["ranks"], backend_name="sf-gang000001-a1",
    submitted_at=now - dt.timedelta(minutes=2), start_time=now - dt.timedelta(minutes=1),
    end_time=now, exit_code=3, failure="exit", end_reason="rank 1 failed with exit code 3",
)
Job.objects.filter(pk=job.pk).update(current_attempt=attempt)
logstore.append(job.pk, 1, spec["lines"])
ingest.append(job.pk, 1, spec["points"])
print(json.dumps({"job": job.pk}))
"""
APPEND = """
import json
import time
from jobs.stores import logstore
appended = {}
for batch in json.loads(BATCHES):  # each batch its own commit, so its own pushed message
    started = time.time()
    logstore.append(JOB, 1, batch)
    appended.update({line["text"]: started for line in batch})
print(json.dumps(appended))
"""
# When each line (its text without the rank mark) was first shown, in epoch seconds.
WATCH_ARRIVALS = """() => {
    window.sfShownAt = {};
    new MutationObserver((records) => {
        for (const record of records) for (const node of record.addedNodes) {
            if (!node.classList || !node.classList.contains("line")) continue;
            const mark = node.querySelector(".rank");
            const text = node.textContent.slice(mark ? mark.textContent.length : 0);
            if (!(text in window.sfShownAt)) window.sfShownAt[text] = Date.now() / 1000;
        }
    }).observe(document.querySelector("#logs-tab pre.logs"), {childList: true});
}"""
LIVE_WITHIN_S = 1.0  # pushed lines show at once; the catch-up fetch comes 1.5 s after a batch
LINES = """() => [...document.querySelectorAll("#logs-tab pre.logs .line")].map((el) => {
    const mark = el.querySelector(".rank");
    return {
        rank: el.dataset.rank === undefined ? null : Number(el.dataset.rank),
        shown: el.innerText.trim(),
        text: el.textContent.slice(mark ? mark.textContent.length : 0),
    };
})"""


def line_text(seq: int, rank: int) -> str:
    return f"rank {rank} says hello, line {seq}"


def wire_line(seq: int, rank: int) -> dict:
    return {
        "seq": seq,
        "rank": rank,
        "stream": "stdout",
        "ts": time.time(),
        "text": line_text(seq, rank),
    }


def system_points() -> list[dict]:
    points, ts = [], time.time()
    for rank, named in SYSTEM.items():
        points.append(
            {
                "kind": "system",
                "name": f"rank{rank}/nvml_available",
                "step": 0,
                "value": 1.0,
                "ts": ts,
            }
        )
        for name, values in named.items():
            points += [
                {
                    "kind": "system",
                    "name": f"rank{rank}/{name}",
                    "step": step,
                    "value": v,
                    "ts": ts + step,
                }
                for step, v in enumerate(values, start=1)
            ]
    return [{"seq": seq, **point} for seq, point in enumerate(points)]


@pytest.fixture(scope="module")
def gang(stack) -> int:
    """A FAILED two-node job (4 a100 per node) of team hpc's member dana, both ranks reported,
    with HISTORY's log lines and SYSTEM's series stored; its id."""
    spec = {
        "ranks": RANKS,
        "lines": [wire_line(seq, rank) for seq, rank in enumerate(HISTORY)],
        "points": system_points(),
    }
    code = f"SPEC = {json.dumps(spec)!r}\n{SETUP_GANG}"
    return json.loads(stack._manage("shell", "-c", code).stdout.strip().splitlines()[-1])["job"]


@pytest.fixture
def page(browser, stack, gang):
    context = browser.new_context(base_url=stack.url)
    page = context.new_page()
    sign_in(page, stack.url, "dana", "dana-pw")
    yield page
    context.close()


def test_job_page_shows_nodes_times_gpus_and_each_ranks_node_state_and_exit(page, gang):
    page.goto(f"/jobs/{gang}/")
    expect(page.locator(".job-head .gpus")).to_have_text("8 GPU(s) (2 nodes × 4 a100)")
    table = page.locator(".job-head table.ranks")
    expect(table).to_be_visible()
    expect(table.locator("thead th")).to_have_text(["rank", "node", "state", "exit"])
    rows = table.locator("tbody tr")
    expect(rows).to_have_count(2)
    for row, rank in zip(rows.all(), RANKS, strict=True):
        expect(row.locator("td")).to_have_text(
            [str(rank["rank"]), rank["node"], rank["state"], str(rank["exit_code"])]
        )
    page.screenshot(path=str(_artifact("multinode-head.png")))


def test_logs_are_marked_with_their_rank_and_the_filter_shows_one_ranks_lines_live(
    page, stack, gang
):
    page.goto(f"/jobs/{gang}/#logs")
    expect(page.locator("#tab-logs")).to_be_visible()
    select = page.locator("#logs-tab select.logs-rank")
    expect(select.locator("option")).to_have_text(
        ["all ranks", f"rank 0 ({NODES[0]})", f"rank 1 ({NODES[1]})"]
    )
    shown = list(enumerate(HISTORY))  # (seq, rank) of the lines the page should show
    _expect_all_marked(page, shown, "the stored lines, each marked with its rank")
    page.evaluate(WATCH_ARRIVALS)
    _wait_live(page, gang)

    # A pushed line is shown at once, and marked too.
    appended = _append(stack, gang, [[wire_line(6, 0)]])
    shown.append((6, 0))
    _expect_all_marked(page, shown, "a pushed line of rank 0, marked")
    _assert_live(page, appended)
    page.screenshot(path=str(_artifact("multinode-logs-all.png")))

    select.select_option("1")
    ones = [(seq, rank) for seq, rank in shown if rank == 1]
    _expect_only(page, ones, 1, "rank 1's stored lines only")
    _wait_live(page, gang)
    # Rank 1's line 7 is pushed and shown first, so that rank 0's line 8, pushed next in a batch
    # of its own, continues the last line shown: only the rank filter keeps it out. Then rank
    # 0's 9 and rank 1's 10 in one batch; once line 10 is shown every batch before it is handled.
    appended = _append(stack, gang, [[wire_line(7, 1)]])
    shown.append((7, 1))
    ones.append((7, 1))
    _expect_only(page, ones, 1, "rank 1's pushed line 7")
    _assert_live(page, appended)
    appended = _append(stack, gang, [[wire_line(8, 0)], [wire_line(9, 0), wire_line(10, 1)]])
    shown += [(8, 0), (9, 0), (10, 1)]
    ones.append((10, 1))
    _expect_only(page, ones, 1, "rank 1's pushed line 10, and neither of rank 0's")
    _assert_live(page, {line_text(10, 1): appended[line_text(10, 1)]})
    page.wait_for_timeout(2500)  # past the page's catch-up fetch after a quiet moment (1.5 s)
    _expect_only(page, ones, 1, "still not rank 0's pushed line after the catch-up fetch")
    page.screenshot(path=str(_artifact("multinode-logs-rank1.png")))

    select.select_option("")
    _expect_all_marked(page, shown, "every rank's lines again, the pushed ones too, marked")


def test_system_tab_has_a_group_per_rank_titled_with_its_rank_and_node(page, gang):
    page.goto(f"/jobs/{gang}/#system")
    system = page.locator("#tab-system")
    expect(system).to_be_visible()
    groups = system.locator(".rank-group")
    expect(groups).to_have_count(len(RANKS))
    for rank, node in NODES.items():
        group = system.locator(f'.rank-group[data-prefix="rank{rank}/"]')
        expect(group).to_be_visible(timeout=15000)
        expect(group.locator("h3")).to_have_text(f"rank {rank} · {node}")
        charts = group.locator(".charts > [data-metric]")
        expect(charts).to_have_count(len(SYSTEM[rank]), timeout=15000)
        for name in SYSTEM[rank]:
            chart = group.locator(f'[data-metric="rank{rank}/{name}"] .main-svg').first
            expect(chart).to_be_visible()  # drawn by Plotly, on screen
    drawn = page.evaluate(
        """() => [...document.querySelectorAll("#tab-system .rank-group")].map((g) => ({
            prefix: g.dataset.prefix,
            title: g.querySelector("h3").innerText,
            charts: [...g.querySelectorAll(".charts > [data-metric]")].map((div) => ({
                metric: div.dataset.metric,
                title: div.layout.title.text,
                y: div.data[0].y,
            })),
        }))"""
    )
    assert drawn == [
        {
            "prefix": f"rank{rank}/",
            "title": f"rank {rank} · {NODES[rank]}",
            "charts": [
                {"metric": f"rank{rank}/{name}", "title": name, "y": values}
                for name, values in sorted(SYSTEM[rank].items())
            ],
        }
        for rank in sorted(SYSTEM)
    ], drawn
    # Every series is a rank's: none is drawn outside the groups, and no empty-tab sentence.
    expect(system.locator(":scope > .charts > [data-metric]")).to_have_count(0)
    expect(system.locator(":scope > p.empty")).to_be_hidden()
    page.screenshot(path=str(_artifact("multinode-system.png")), full_page=True)


def _append(stack: Stack, job_id: int, batches: list[list[dict]]) -> dict[str, float]:
    """Append each batch with logstore.append in the stack's ledger (each pushed to the page);
    when each line's append began: {text: epoch seconds}."""
    code = f"JOB = {job_id}\nBATCHES = {json.dumps(batches)!r}\n{APPEND}"
    return json.loads(stack._manage("shell", "-c", code).stdout.strip().splitlines()[-1])


def _assert_live(page: Page, appended: dict[str, float]) -> None:
    """Each of these lines was shown within LIVE_WITHIN_S of its append: pushed, not fetched
    later by the page's catch-up after a quiet moment."""
    shown_at = page.evaluate("() => window.sfShownAt")
    delays = {text: shown_at[text] - at for text, at in appended.items() if text in shown_at}
    assert set(delays) == set(appended), (appended, shown_at)
    assert max(delays.values()) < LIVE_WITHIN_S, delays


def _expect_all_marked(page: Page, shown: list[tuple[int, int]], what: str) -> None:
    """The Logs tab shows exactly these lines in order, each marked `[rank N]` on screen."""
    expected = [
        {
            "rank": rank,
            "shown": f"[rank {rank}] {line_text(seq, rank)}",
            "text": line_text(seq, rank),
        }
        for seq, rank in shown
    ]
    _wait_lines(page, expected, what)


def _expect_only(page: Page, shown: list[tuple[int, int]], rank: int, what: str) -> None:
    """The Logs tab shows exactly these lines of `rank` in order (marked or not)."""
    expected = [line_text(seq, r) for seq, r in shown]
    lines = _wait_lines(page, expected, what, lambda ls: [line["text"] for line in ls])
    assert [line["rank"] for line in lines] == [rank] * len(shown), lines


def _wait_lines(page: Page, expected: list, what: str, view=lambda lines: lines) -> list[dict]:
    deadline = time.monotonic() + 10
    while True:
        lines = page.evaluate(LINES)
        if view(lines) == expected:
            return lines
        if time.monotonic() > deadline:
            raise AssertionError(f"the Logs tab did not show {what}:\n{lines}\nexpected {expected}")
        page.wait_for_timeout(100)


def _wait_live(page: Page, job_id: int) -> None:
    """A line pushed before the socket is open would be missed (until a catch-up fetch)."""
    page.wait_for_function(
        f"() => window.StarforgeLive.socket('/ws/jobs/{job_id}/').state === 'open'",
        timeout=10000,
    )


def _artifact(name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name
