"""What the job reads keep of a row (`jobs.reads.prepared.RowMemo`, `jobs.reads.job_rows.ROWS`):
a job listed or read again unchanged is not converted or built again, and whatever changes in
its row, in what the row joins, or in the settings its answer depends on shows at once."""

import pytest

from jobs.models import Cluster, Job, Team
from jobs.reads import job_rows
from jobs.reads.prepared import RowMemo
from tests.api_helpers import submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def built(monkeypatch) -> list[int]:
    """The ids of the jobs whose answers were built, in order."""
    ids: list[int] = []
    real = job_rows.shown_of

    def counted(job: dict) -> dict:
        ids.append(job["id"])
        return real(job)

    monkeypatch.setattr(job_rows, "shown_of", counted)
    job_rows.ROWS.clear()
    return ids


def _listed(api) -> dict[int, dict]:
    response = api.get("/jobs")
    assert response.status_code == 200, response.content
    return {item["id"]: item for item in response.json()["items"]}


def test_a_job_listed_or_read_again_unchanged_is_not_built_again(api, built):
    first, second = submit(api, name="a"), submit(api, name="b")
    assert sorted(built) == [first, second]  # the submits' answers
    job_rows.ROWS.clear()
    built.clear()
    assert set(_listed(api)) == {first, second}
    assert sorted(built) == [first, second]
    again = _listed(api)
    assert api.get(f"/jobs/{first}").json() == again[first]
    assert sorted(built) == [first, second]  # nothing built for the second list or the read
    Job.objects.filter(pk=second).update(priority=7)
    assert _listed(api)[second]["priority"] == 7
    assert sorted(built) == [first, second, second]


@pytest.mark.parametrize(
    "change, field, shown",
    [
        (lambda job: Team.objects.filter(pk=job.team_id).update(name="renamed"), "team", "renamed"),
        (
            lambda job: job.user.__class__.objects.filter(pk=job.user_id).update(username="al"),
            "user",
            "al",
        ),
        (
            lambda job: Cluster.objects.filter(pk=job.cluster_id).update(
                settings={**job.cluster.settings, "output_root": "/elsewhere"}
            ),
            "output_dir",
            None,  # checked below: under /elsewhere
        ),
        (lambda job: Job.objects.filter(pk=job.pk).update(name="late"), "name", "late"),
    ],
    ids=["team renamed", "user renamed", "cluster output_root", "job column"],
)
def test_whatever_changes_in_a_jobs_row_or_what_it_joins_shows_at_once(
    api, built, change, field, shown
):
    job_id = submit(api, name="before")
    before = _listed(api)[job_id]
    change(Job.objects.select_related("user", "cluster").get(pk=job_id))
    for answer in (_listed(api)[job_id], api.get(f"/jobs/{job_id}").json()):
        if shown is None:
            assert answer[field] == f"/elsewhere/{before['run_id']}"
        else:
            assert answer[field] == shown
        assert answer[field] != before[field]


def test_a_changed_setting_shows_on_a_row_that_did_not_change(api, built, settings, tmp_path):
    job_id = submit(api)
    assert _listed(api)[job_id]["output_dir"].startswith(str(settings.SF_OUTPUT_ROOT))
    settings.SF_OUTPUT_ROOT = tmp_path / "moved"
    assert _listed(api)[job_id]["output_dir"] == str(tmp_path / "moved" / _run_id(job_id))
    assert api.get(f"/jobs/{job_id}").json()["output_dir"].startswith(str(tmp_path / "moved"))


def _run_id(job_id: int) -> str:
    return Job.objects.get(pk=job_id).run_id


def test_the_memo_keeps_at_most_its_size_and_builds_a_row_it_cannot_keep_each_time():
    calls: list[list] = []

    def build(row: list) -> tuple:
        calls.append(row)
        return tuple(row)

    memo = RowMemo(build, size=2)
    double = ((1, lambda value: value * 2),)  # the second column, converted
    assert memo.of((1, 10), double) == (1, 20)
    assert memo.of((1, 10), double) == (1, 20)
    assert len(calls) == 1
    memo.of((2, 10), double)
    memo.of((3, 10), double)  # the oldest, (1, 10), gives way
    assert len(memo._kept) == 2 and (1, 10) not in memo._kept
    memo.of((1, 10), double)
    assert len(calls) == 4
    assert memo.of((4, [10]), ()) == (4, [10])  # a value that cannot be a key
    assert memo.of((4, [10]), ()) == (4, [10])
    assert len(calls) == 6 and len(memo._kept) == 2
