"""Management commands an operator types."""

import io

import pytest
from django.core.management import CommandError, call_command

from jobs.auth import hash_token
from jobs.models import ApiToken

pytestmark = pytest.mark.django_db


def test_issue_token_prints_a_token_whose_hash_alone_is_stored(alice):
    out = io.StringIO()
    call_command("issue_token", "alice", "--name", "laptop", stdout=out)
    secret = out.getvalue().strip()
    row = ApiToken.objects.get(key_hash=hash_token(secret))
    assert (row.user, row.name) == (alice, "laptop")
    assert secret not in (row.key_hash, row.prefix)


def test_issue_token_for_an_unknown_user_says_so():
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        call_command("issue_token", "nobody")


def test_prune_snapshots_keeps_what_a_live_or_recent_job_needs(api, team, alice):
    import datetime as dt

    from django.utils import timezone

    from jobs.models import Job, Snapshot
    from jobs.stores.snapshots import snapshot_path
    from tests.api_helpers import upload_snapshot
    from tests.factories import place, queued_job

    sha = upload_snapshot(api)
    snap = Snapshot.objects.get(pk=sha)
    old_failed = place(queued_job(team, alice, snapshot=snap), "FAILED")
    paused = place(queued_job(team, alice, snapshot=snap), "PAUSED")
    long_ago = timezone.now() - dt.timedelta(days=40)
    Job.objects.filter(pk__in=[old_failed.pk, paused.pk]).update(status_changed_at=long_ago)
    call_command("prune_snapshots", "--older-than", "30", stdout=io.StringIO())
    assert snapshot_path(sha).exists()  # the PAUSED job will need it to resume
    paused.delete()
    call_command("prune_snapshots", "--older-than", "30", stdout=io.StringIO())
    assert not snapshot_path(sha).exists()
    body = api.get(f"/jobs/{old_failed.pk}").json()
    assert body["retry_available"] is False
    assert "deleted with `prune_snapshots --older-than 30`" in body["retry_unavailable_reason"]
    refused = api.post(f"/jobs/{old_failed.pk}/retry")
    assert refused.status_code == 409 and "submit again" in refused.json()["detail"]
