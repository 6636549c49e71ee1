"""The job page's System tab: the runner's system samples, drawn from the metrics API."""

import json

import pytest
from django.test import Client

from jobs.models import Job
from tests.api_helpers import submit
from tests.ingesting import attach_attempt, runner

pytestmark = pytest.mark.django_db
T0 = 1_700_000_000.0
NO_NVML = (
    "No GPU telemetry for this job: the runner found no NVML driver on its host; CPU and memory "
    "of the job's processes are shown."
)


def system_points(nvml: float, samples: int) -> list[dict]:
    """What the runner sends: nvml_available at step 0, then one cpu/memory pair per sample."""
    points = [{"kind": "system", "name": "nvml_available", "step": 0, "value": nvml, "ts": T0}]
    for step in range(1, samples + 1):
        for name, value in (("cpu_percent", 99.5), ("memory_mib", 61.0 + step)):
            points.append({"kind": "system", "name": name, "step": step, "value": value, "ts": T0})
    return [{"seq": seq, **point} for seq, point in enumerate(points)]


@pytest.fixture
def job_id(api) -> int:
    job_id = submit(api)
    attach_attempt(job_id, 1)
    return job_id


def signed_in(job_id: int) -> Client:
    client = Client()
    client.force_login(Job.objects.get(pk=job_id).user)
    return client


def ingest(job_id: int, points: list[dict]) -> None:
    body = json.dumps({"attempt": 1, "points": points})
    response = runner(job_id).post("/api/v1/ingest/metrics", body, content_type="application/json")
    assert response.status_code == 200, response.content


def system_tab(page: str) -> str:
    start = page.index('id="tab-system"')
    return page[page.rindex("<section", 0, start) : page.index("</section>", start)]


def test_system_tab_is_drawn_from_the_metrics_api_with_its_sentences(job_id):
    tab = system_tab(signed_in(job_id).get(f"/jobs/{job_id}/").content.decode())
    assert 'data-metrics-kind="system"' in tab and '<div class="charts">' in tab
    assert f'<p class="system-note" hidden>{NO_NVML}</p>' in tab.replace("&#x27;", "'")
    assert '<p class="empty">No system samples yet.</p>' in tab
    assert "invented" not in tab and "does not sample NVML yet" not in tab


def test_metrics_api_returns_the_system_series(job_id):
    ingest(job_id, system_points(nvml=0.0, samples=3))
    client = signed_in(job_id)
    body = client.get(f"/api/v1/jobs/{job_id}/metrics?kind=system").json()
    assert set(body["series"]) == {"nvml_available", "cpu_percent", "memory_mib"}
    assert body["series"]["memory_mib"]["x"] == [1, 2, 3]
    assert body["series"]["memory_mib"]["y"] == [62.0, 63.0, 64.0]
    assert body["latest"]["nvml_available"]["value"] == 0.0  # the page's "no NVML" sentence
    assert client.get(f"/api/v1/jobs/{job_id}/metrics?kind=train").json()["series"] == {}


def test_no_system_points_means_empty_series(job_id):
    body = signed_in(job_id).get(f"/api/v1/jobs/{job_id}/metrics?kind=system").json()
    assert body == {"series": {}, "latest": {}}  # the page says "No system samples yet."
