"""The browser suites' shared parts: the real stack per module and Debian's Chromium."""

import os

import pytest

from tests.browser.pages import SETUP_USERS, sign_in
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


@pytest.fixture(scope="module")
def carol_token(stack) -> str:
    """carol (of team vision) and her token, made on the module's stack."""
    return stack._manage("shell", "-c", SETUP_USERS).stdout.strip().splitlines()[-1]


@pytest.fixture
def open_page(browser, stack, carol_token):
    """open_page(color_scheme) -> a page signed in as carol, in a browser context of its own."""
    contexts = []

    def open_(color_scheme: str = "light"):
        context = browser.new_context(base_url=stack.url, color_scheme=color_scheme)
        contexts.append(context)
        page = context.new_page()
        sign_in(page, stack.url, "carol", "carol-pw")
        return page

    yield open_
    for context in contexts:
        context.close()
