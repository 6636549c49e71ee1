"""Log line latency from the job's print() to the browser's Logs tab, through the real stack:
runner batch → ingest API → Channels (Redis) → websocket → the page's DOM, in Chromium.

Run: `.venv/bin/python bench/live_bench.py` (also part of `make bench`). Needs /usr/bin/chromium.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LINES = 300
TICKER = f"""
import time
for i in range({LINES} + 40):
    print(f"tick {{i}} {{time.time():.4f}}", flush=True)
    time.sleep(0.05)
"""
WATCH = """() => {
    window.sfDelays = [];
    new MutationObserver((records) => {
        for (const r of records) for (const n of r.addedNodes) {
            const m = /^tick \\d+ (\\d+\\.\\d+)$/.exec(n.textContent || "");
            if (m) window.sfDelays.push(Date.now() / 1000 - parseFloat(m[1]));
        }
    }).observe(document.querySelector("#tab-logs"), {childList: true, subtree: true});
}"""


def run() -> dict:
    from playwright.sync_api import sync_playwright

    from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS
    from tests.browser.pages import sign_in, submit
    from tests.e2e.stack import Stack

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "var").mkdir()
        stack = Stack(Path(tmp) / "var").start()
        try:
            work = Path(tmp) / "project"
            work.mkdir()
            (work / "ticker.py").write_text(TICKER)
            job_id = submit(stack, stack.token, work, "python", "ticker.py")
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(base_url=stack.url)
                sign_in(page, stack.url, "demo", stack.password)
                page.goto(f"/jobs/{job_id}/#logs")
                page.evaluate(WATCH)
                page.wait_for_function("() => window.sfDelays.length >= 20", timeout=60000)
                page.evaluate("() => { window.sfDelays = []; }")  # connection set-up is history
                page.wait_for_function(
                    f"() => window.sfDelays.length >= {LINES - 60}", timeout=120000
                )
                delays = sorted(page.evaluate("() => window.sfDelays"))
                browser.close()
        finally:
            stack.close()
    ms = [d * 1000 for d in delays]
    return {
        "lines": len(ms),
        "p50_ms": round(statistics.median(ms), 1),
        "p95_ms": round(ms[int(len(ms) * 0.95) - 1], 1),
        "max_ms": round(ms[-1], 1),
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
