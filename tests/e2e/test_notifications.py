"""Notifications end to end on the real stack (web server, Celery worker and beat, the local
executor): `sf notify add` points a webhook at a real receiver on this host (allowed through
SF_WEBHOOK_ALLOWED_NETS, as an operator would allow an internal one), a job succeeds, and
the worker delivers the signed payload after the ledger's commit. The receiver fails the first
try; beat's sweep retries it under the same idempotency key, and `sf notify show` has both
tries in the delivery log."""

import json
from collections.abc import Iterator

import pytest

from jobs.loops import deliveries
from jobs.webhooks import send
from tests.e2e.stack import wait_until
from tests.engines.proof import EngineProof, on_local_stack
from tests.receiver import Receiver

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def proof(tmp_path_factory) -> Iterator[EngineProof]:
    with on_local_stack(tmp_path_factory, SF_WEBHOOK_ALLOWED_NETS="127.0.0.0/8") as running:
        yield running


def test_a_finished_job_reaches_a_failing_receiver_signed_and_retried_once_more(proof):
    receiver = Receiver(fail_first=1)
    try:
        added = json.loads(
            proof.sf("notify", "add", receiver.url, "--on", "succeeded,failed", "--json").stdout
        )
        job = proof.submit("--gpus", "1", "--", "python", "-c", "print('hello')")
        done = proof.wait_status(job["id"], "SUCCEEDED")
        # First try at once (the task after commit), the second after the first backoff and
        # the next sweep of beat.
        wait_until(
            lambda: len(receiver.requests) >= 2,
            deliveries.FIRST_RETRY_S + 30,
            "the retried delivery",
            proof.stack.diagnostics,
        )
        first, second = receiver.requests[:2]
        assert first["headers"]["Idempotency-Key"] == second["headers"]["Idempotency-Key"]
        assert first["body"] == second["body"]
        assert send.verify(
            added["secret"], second["headers"]["Starforge-Signature"], second["body"]
        )
        sent = json.loads(second["body"])
        assert sent["event"] == "succeeded" and sent["job"]["id"] == job["id"]
        assert sent["job"]["status"] == "SUCCEEDED" and sent["job"]["run_id"] == done["run_id"]
        assert sent["job"]["url"].endswith(f"/jobs/{job['id']}/")
        shown = json.loads(proof.sf("notify", "show", str(added["id"]), "--json").stdout)
        (delivery,) = shown["deliveries"]
        assert delivery["state"] == "delivered"
        assert [t["status"] for t in delivery["tries"]] == [500, 200]
    finally:
        receiver.close()
