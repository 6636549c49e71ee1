"""The browser suites' shared parts: the real stack per module and Debian's Chromium."""

import os

import pytest

from tests.e2e.stack import Stack

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        pytest.fail("Chromium is missing: `make test` installs Debian's chromium package")
    running = Stack(tmp_path_factory.mktemp("var")).start()
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
