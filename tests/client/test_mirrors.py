"""The client cannot import the server: the few values both sides must agree on that are not
the runner's contract (`sf.contract`) are mirrored in the client, and each mirror equals the
server's own."""

from django.conf import settings
from sf import metrics, project
from sf.commands import logs, notify

from jobs.models import MetricKind, Webhook
from jobs.stores import snapshots
from jobs.stores.metrics import ingest


def test_the_sdk_refuses_the_metric_names_the_server_refuses():
    assert metrics.MAX_NAME == ingest.MAX_NAME


def test_the_cli_reads_the_project_file_the_server_reads_from_a_snapshot():
    assert project.PROJECT_FILE == snapshots.PROJECT_FILE


def test_the_sdk_logs_the_kinds_the_server_stores_but_the_runners_own():
    assert set(metrics.KINDS) == set(MetricKind.values) - {MetricKind.SYSTEM}


def test_the_cli_names_the_webhook_events_the_server_knows():
    assert notify.NOTIFY_EVENTS == tuple(Webhook.Event.values)


def test_sf_logs_asks_for_the_largest_page_the_server_serves_by_default():
    assert logs.LOG_PAGE_LINES == settings.SF_LOG_PAGE_MAX_LINES
