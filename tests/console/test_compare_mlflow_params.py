"""The compare page's "parameters that differ" rows for the params jobs' code logged through
MLflow (the latest attempt's that logged any), escaped like every other name and value."""

import re

import pytest
from django.test import Client

from jobs.stores.params import log_params
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.django_db


def test_mlflow_params_that_differ_are_rows_of_their_own_and_escaped(team, alice):
    a, b, c = (queued_job(team, alice) for _ in range(3))
    for job in (a, b, c):
        with_attempt(job, "SUCCEEDED")
    log_params(a.pk, 1, {"lr": "0.1", "batch": "32", "<b>x</b>": "<script>alert(1)</script>"})
    log_params(b.pk, 1, {"lr": "0.5", "batch": "32"})
    b.refresh_from_db()
    with_attempt(b, "SUCCEEDED")
    log_params(b.pk, 2, {"lr": "0.01", "batch": "32"})  # a retry's params are the job's now

    client = Client()
    client.force_login(alice)
    page = client.get("/compare/", {"jobs": f"{a.pk},{b.pk},{c.pk}"})

    rows = {r["label"]: [c["text"] for c in r["cells"]] for r in page.context["differing"]}
    assert rows["mlflow param lr"] == ["0.1", "0.01", "—"]
    assert rows["mlflow param batch"] == ["32", "32", "—"]
    assert rows["mlflow param <b>x</b>"] == ["<script>alert(1)</script>", "—", "—"]
    table = re.search(
        r'<table id="compare-params">(.*?)</table>', page.content.decode(), re.S
    ).group(1)
    assert "<script>alert(1)</script>" not in table and "&lt;script&gt;" in table
    assert "<b>x</b>" not in table
