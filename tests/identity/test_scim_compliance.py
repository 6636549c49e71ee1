"""Issue 51, point 2: scim2-tester, a SCIM compliance checker, run against the live /scim/v2/
for Users and Groups (discovery, create, read, query, replace, patch, delete) finds no error."""

import httpx2
import pytest
from scim2_client.engines.httpx2 import SyncSCIMClient
from scim2_tester import Status, check_server

from tests.identity.scim_calls import SCIM_TOKEN

pytestmark = pytest.mark.django_db(transaction=True)


def test_scim2_tester_finds_no_error(live_server, settings):
    settings.SF_SCIM_TOKEN = SCIM_TOKEN
    http = httpx2.Client(
        base_url=f"{live_server.url.replace('localhost', '127.0.0.1')}/scim/v2",
        headers={"Authorization": f"Bearer {SCIM_TOKEN}"},
        timeout=30,
    )
    with http:
        results = check_server(SyncSCIMClient(http), resource_types=["User", "Group"])

    bad = [r for r in results if r.status in (Status.ERROR, Status.CRITICAL)]
    assert not bad, "\n".join(f"{r.status.name} {r.title}: {r.reason}" for r in bad)
    passed = [r for r in results if r.status == Status.SUCCESS]
    assert len(passed) >= 20, [f"{r.status.name} {r.title}" for r in results]
