"""The client cannot import the server: the few values both sides must agree on that are not
the runner's contract (`sf.contract`) are mirrored in the client, and each mirror equals the
server's own."""

from sf import metrics, project

from jobs.stores import snapshots
from jobs.stores.metrics import ingest


def test_the_sdk_refuses_the_metric_names_the_server_refuses():
    assert metrics.MAX_NAME == ingest.MAX_NAME


def test_the_cli_reads_the_project_file_the_server_reads_from_a_snapshot():
    assert project.PROJECT_FILE == snapshots.PROJECT_FILE
