"""Follow-on jobs (`--then`): checked at submit against starforge.toml, created once on success.

The reconciler closes the parent's attempt and, in the same transaction, creates one QUEUED
child per name; a parent that fails or is stopped creates none and its timeline says so.
"""

import datetime as dt
import gzip
import io
import tarfile

import pytest
from django.conf import settings
from django.utils import timezone

from jobs.executors import Observation
from jobs.ledger import lifecycle
from jobs.loops.launcher import launch_attempts, launch_spec
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Job, JobEvent, ScheduleWindow
from jobs.states import JobStatus
from tests.api_helpers import assert_refused
from tests.factories import with_attempt

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("kicks")]

S = JobStatus
PROJECT = b"""
[then.eval]
entrypoint = "python eval.py --split 'held out'"
gpus = 1

[then.export]
entrypoint = ["python", "export.py"]
"""


def archive(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def upload(api, project: bytes | None = PROJECT, name: str = "starforge.toml") -> str:
    files = {"train.py": b"print('train')\n"}
    if project is not None:
        files[name] = project
    response = api.client.post("/api/v1/snapshots", archive(files), content_type="application/gzip")
    assert response.status_code == 201, response.content
    return response.json()["sha256"]


def submit_then(api, then=("eval", "export"), **fields):
    body = {"entrypoint": ["python", "train.py"], "then": list(then), **fields}
    return api.post("/jobs", body)


def ledger() -> tuple[int, int]:
    return Job.objects.count(), JobEvent.objects.count()


def notes(job: Job) -> list[str]:
    return list(
        JobEvent.objects.filter(job=job, kind=JobEvent.Kind.NOTE)
        .order_by("pk")
        .values_list("reason", flat=True)
    )


@pytest.fixture
def parent(api, backend) -> Job:
    """A job submitted with `--then eval --then export`, now PENDING on attempt ref-1."""
    response = submit_then(api, snapshot=upload(api), env={"SEED": "7"}, priority=5)
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    with_attempt(job, S.PENDING, job_ref="ref-1")
    job.refresh_from_db()
    return job


def end(backend, native: str, exit_code: int, ref: str = "ref-1") -> None:
    now = timezone.now()
    backend.states[ref] = Observation(
        native, exit_code=exit_code, start_time=now - dt.timedelta(minutes=2), end_time=now
    )
    reconcile_all()


def children(parent: Job) -> dict[str, Job]:
    return {c.follow_on_name: c for c in Job.objects.filter(parent=parent)}


# -- submit ---------------------------------------------------------------------------------------


def test_submit_with_then_is_accepted_and_shows_the_names(api, backend):
    response = submit_then(api, snapshot=upload(api))
    assert response.status_code == 201, response.content
    assert response.json()["then"] == ["eval", "export"]
    assert response.json()["parent"] is None


def test_submit_keeps_each_follow_on_spec_split_into_argv(api, backend):
    job_id = submit_then(api, snapshot=upload(api)).json()["id"]
    job = Job.objects.get(pk=job_id)
    assert job.follow_on_specs == {
        "eval": {"entrypoint": ["python", "eval.py", "--split", "held out"], "gpus": 1},
        "export": {"entrypoint": ["python", "export.py"], "gpus": 0},
    }


def test_starforge_toml_may_sit_under_a_dot_slash_prefix(api, backend):
    response = submit_then(api, snapshot=upload(api, name="./starforge.toml"))
    assert response.status_code == 201, response.content


def test_a_subset_of_the_tables_may_be_asked_for(api, backend):
    response = submit_then(api, then=["export"], snapshot=upload(api))
    assert response.json()["then"] == ["export"]
    assert list(Job.objects.get().follow_on_specs) == ["export"]


def test_then_without_a_snapshot_is_refused(api, backend):
    before = ledger()
    assert_refused(submit_then(api), 400, "--then needs a snapshot", "starforge.toml")
    assert ledger() == before


def test_then_with_a_snapshot_without_starforge_toml_is_refused(api, backend):
    sha = upload(api, project=None)
    before = ledger()
    assert_refused(submit_then(api, snapshot=sha), 400, "[then.eval]", "starforge.toml")
    assert ledger() == before


def test_starforge_toml_below_the_root_does_not_count(api, backend):
    sha = upload(api, name="sub/starforge.toml")
    before = ledger()
    assert_refused(submit_then(api, snapshot=sha), 400, "[then.eval] table")
    assert ledger() == before


def test_then_naming_a_missing_table_is_refused(api, backend):
    sha = upload(api)
    before = ledger()
    detail = assert_refused(
        submit_then(api, then=["eval", "bench"], snapshot=sha), 400, "[then.bench]"
    )["detail"]
    assert "eval" not in detail.replace("[then.bench]", "")
    assert ledger() == before


def test_a_then_entry_that_is_not_a_table_is_refused(api, backend):
    sha = upload(api, project=b'then = { eval = "python eval.py" }\n')
    before = ledger()
    assert_refused(submit_then(api, then=["eval"], snapshot=sha), 400, "[then.eval] table")
    assert ledger() == before


@pytest.mark.parametrize(
    "entrypoint",
    [
        "3",
        '""',
        '"   "',
        "[]",
        '["python", 3]',
        "{ cmd = 'python' }",
        '["python", ""]',
        '"python eval.py \\"unclosed"',
        '"python eval.py\\u0000"',
        '["python\\u0000", "eval.py"]',
    ],
    ids=[
        "number",
        "empty",
        "blank",
        "empty-list",
        "non-string-item",
        "table",
        "empty-argument",
        "unbalanced-quote",
        "nul-in-string",
        "nul-in-list",
    ],
)
def test_a_bad_follow_on_entrypoint_is_refused(api, backend, entrypoint):
    sha = upload(api, project=f"[then.eval]\nentrypoint = {entrypoint}\n".encode())
    before = ledger()
    assert_refused(submit_then(api, then=["eval"], snapshot=sha), 400, "[then.eval]", "entrypoint")
    assert ledger() == before


def test_a_follow_on_without_an_entrypoint_is_refused(api, backend):
    sha = upload(api, project=b"[then.eval]\ngpus = 1\n")
    before = ledger()
    assert_refused(submit_then(api, then=["eval"], snapshot=sha), 400, "needs an entrypoint")
    assert ledger() == before


@pytest.mark.parametrize("gpus", ["9", "-1", "1.5", "true", '"2"'])
def test_follow_on_gpus_outside_the_team_quota_or_not_an_integer_are_refused(api, backend, gpus):
    sha = upload(api, project=f'[then.eval]\nentrypoint = "e"\ngpus = {gpus}\n'.encode())
    before = ledger()
    assert_refused(
        submit_then(api, then=["eval"], snapshot=sha), 400, "[then.eval] gpus", "quota of 8"
    )
    assert ledger() == before


def test_follow_on_gpus_at_the_team_quota_are_accepted(api, backend):
    sha = upload(api, project=b'[then.eval]\nentrypoint = "e"\ngpus = 8\n')
    assert submit_then(api, then=["eval"], snapshot=sha).status_code == 201


def test_follow_on_gpus_beyond_the_cluster_are_refused(api, backend, team):
    team.gpu_quota = 16
    team.save()
    sha = upload(api, project=b'[then.eval]\nentrypoint = "e"\ngpus = 12\n')
    before = ledger()
    assert_refused(
        submit_then(api, then=["eval"], snapshot=sha), 400, "[then.eval]", "12 GPUs", "has 8"
    )
    assert ledger() == before


def test_invalid_toml_is_refused(api, backend):
    sha = upload(api, project=b"[then.eval\nentrypoint = \n")
    before = ledger()
    assert_refused(submit_then(api, snapshot=sha), 400, "starforge.toml is not valid TOML")
    assert ledger() == before


def test_starforge_toml_that_is_not_utf8_is_refused(api, backend):
    sha = upload(api, project=b'[then.eval]\nentrypoint = "\xff"\n')
    before = ledger()
    assert_refused(submit_then(api, snapshot=sha), 400, "starforge.toml is not valid TOML")
    assert ledger() == before


def test_a_name_given_twice_is_422(api, backend):
    sha = upload(api)
    before = ledger()
    assert_refused(submit_then(api, then=["eval", "eval"], snapshot=sha), 422, "once")
    assert ledger() == before


@pytest.mark.parametrize("name", ["has space", "", "a" * 51, "dot.name", "ünï"])
def test_a_name_outside_the_pattern_is_422(api, backend, name):
    sha = upload(api)
    before = ledger()
    assert_refused(submit_then(api, then=[name], snapshot=sha), 422, "then")
    assert ledger() == before


# -- created on success ---------------------------------------------------------------------------


def test_success_creates_one_queued_child_per_name(parent, backend):
    end(backend, "OK", 0)
    parent.refresh_from_db()
    assert parent.status == S.SUCCEEDED
    made = children(parent)
    assert sorted(made) == ["eval", "export"]
    assert {c.status for c in made.values()} == {S.QUEUED}


def test_a_string_entrypoint_is_split_like_a_shell_would(parent, backend):
    end(backend, "OK", 0)
    made = children(parent)
    assert made["eval"].entrypoint == ["python", "eval.py", "--split", "held out"]
    assert made["export"].entrypoint == ["python", "export.py"]


def test_each_child_takes_its_gpus_from_its_spec(parent, backend):
    end(backend, "OK", 0)
    made = children(parent)
    assert (made["eval"].total_gpus, made["export"].total_gpus) == (1, 0)


def test_children_share_the_parents_snapshot_team_user_and_settings(parent, backend):
    end(backend, "OK", 0)
    for child in children(parent).values():
        assert (child.snapshot_id, child.team_id, child.user_id, child.cluster_id) == (
            parent.snapshot_id,
            parent.team_id,
            parent.user_id,
            parent.cluster_id,
        )
        assert (child.env, child.priority) == ({"SEED": "7"}, 5)
        assert child.run_id != parent.run_id
        assert (child.then, child.retry_count, child.attempt_count) == ([], 0, 0)


def test_children_keep_what_the_parent_asked_of_each_node_and_its_window_policy(parent, backend):
    window = ScheduleWindow.objects.create(name="nights", spec="mon-sun 20:00-08:00")
    asked = {"gpu_type": "a100", "cpus": 16, "memory_mb": 65536, "image": "lab/train:3"}
    Job.objects.filter(pk=parent.pk).update(**asked, window=window, window_policy="pause")
    end(backend, "OK", 0)
    made = children(parent)
    for child in made.values():
        assert (child.cpus, child.memory_mb, child.image) == (16, 65536, "lab/train:3")
        assert (child.window, child.window_policy, child.nodes) == (window, "pause", 1)
    # the GPU type goes with GPUs: eval asks for 1, export for none (as submit allows)
    assert (made["eval"].gpu_type, made["export"].gpu_type) == ("a100", "")


def test_each_child_starts_its_timeline_with_a_queued_event(parent, backend):
    end(backend, "OK", 0)
    for name, child in children(parent).items():
        event = JobEvent.objects.get(job=child)
        assert (event.from_status, event.to_status, event.actor) == ("", S.QUEUED, "follow-on")
        assert event.reason == f"follow-on {name} of job {parent.pk}"


def test_the_parents_timeline_names_each_child(parent, backend):
    end(backend, "OK", 0)
    made = children(parent)
    assert notes(parent) == [
        f"follow-on eval created as job {made['eval'].pk}",
        f"follow-on export created as job {made['export'].pk}",
    ]


def test_the_api_shows_a_child_with_its_parent(parent, backend, api):
    end(backend, "OK", 0)
    child = children(parent)["eval"]
    body = api.get(f"/jobs/{child.pk}").json()
    assert (body["parent"], body["follow_on_name"], body["status"]) == (parent.pk, "eval", "QUEUED")


def test_creating_children_kicks_the_scheduler_after_commit(
    parent, backend, kicks, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        end(backend, "OK", 0)
    assert kicks == ["tick"]


def test_seeing_the_success_again_creates_nothing_more(parent, backend):
    end(backend, "OK", 0)
    before = ledger()
    reconcile_all()
    reconcile_all()
    assert ledger() == before
    assert len(children(parent)) == 2


def test_calling_after_success_again_creates_nothing_more(parent, backend):
    end(backend, "OK", 0)
    before = ledger()
    assert lifecycle.after_success(parent.pk) == []
    assert ledger() == before


def test_after_success_fills_in_only_the_missing_children(parent, backend):
    end(backend, "OK", 0)
    children(parent)["export"].delete()
    (made,) = lifecycle.after_success(parent.pk)
    assert made.follow_on_name == "export"
    assert sorted(children(parent)) == ["eval", "export"]


def test_children_are_admitted_and_launched_like_any_job(parent, backend, monkeypatch):

    end(backend, "OK", 0)
    launch_attempts(admit_queued_jobs().admitted)
    made = children(parent)
    assert {c.status for c in Job.objects.filter(parent=parent)} == {S.PENDING}
    assert sorted(backend.submitted) == sorted(f"sf-{c.run_id}-a1" for c in made.values())


# -- not created ----------------------------------------------------------------------------------


def test_a_failed_parent_creates_no_children(parent, backend):
    end(backend, "BAD", 1)
    parent.refresh_from_db()
    assert parent.status == S.FAILED
    assert not Job.objects.filter(parent=parent).exists()


def test_a_failed_parent_says_its_children_were_not_created(parent, backend):
    end(backend, "BAD", 1)
    assert notes(parent) == [
        "follow-on jobs eval, export were not created: the job ended FAILED, not SUCCEEDED"
    ]


@pytest.mark.parametrize("status", [S.QUEUED, S.PENDING, S.PAUSED])
def test_a_stopped_parent_creates_none_and_says_so(parent, backend, api, status):
    Job.objects.filter(pk=parent.pk).update(status=status)
    assert api.post(f"/jobs/{parent.pk}/stop").status_code == 200
    assert not Job.objects.filter(parent=parent).exists()
    assert notes(parent) == [
        "follow-on jobs eval, export were not created: the job ended STOPPED, not SUCCEEDED"
    ]


def test_a_stopped_parent_whose_backend_then_reports_success_creates_none(parent, backend, api):
    api.post(f"/jobs/{parent.pk}/stop")
    end(backend, "OK", 0)
    assert Job.objects.get(pk=parent.pk).status == S.STOPPED
    assert not Job.objects.filter(parent=parent).exists()


def test_stopping_a_parent_waiting_for_an_automatic_retry_says_children_were_not_created(
    parent, backend, api
):
    Job.objects.filter(pk=parent.pk).update(max_retries=2, retry_cooldown_s=60)
    end(backend, "BAD", 1)
    assert Job.objects.get(pk=parent.pk).next_attempt_at is not None
    api.post(f"/jobs/{parent.pk}/stop")
    assert notes(parent)[-1] == (
        "follow-on jobs eval, export were not created: the job ended STOPPED, not SUCCEEDED"
    )


def test_stopping_a_parent_that_already_failed_does_not_repeat_the_note(parent, backend, api):
    end(backend, "BAD", 1)
    api.post(f"/jobs/{parent.pk}/stop")
    assert len([n for n in notes(parent) if "were not created" in n]) == 1


def test_a_parent_that_succeeds_on_a_retry_creates_its_children_then(parent, backend, api):
    end(backend, "BAD", 1)
    assert api.post(f"/jobs/{parent.pk}/retry").status_code == 200
    parent.refresh_from_db()
    with_attempt(parent, S.PENDING, job_ref="ref-2")
    end(backend, "OK", 0, ref="ref-2")
    assert sorted(children(parent)) == ["eval", "export"]


def test_a_job_without_then_creates_nothing_and_notes_nothing(api, backend):
    job = Job.objects.get(pk=api.post("/jobs", {"entrypoint": ["x"]}).json()["id"])
    with_attempt(job, S.PENDING, job_ref="ref-1")
    end(backend, "OK", 0)
    assert Job.objects.count() == 1
    assert notes(job) == []


# -- the launch environment -----------------------------------------------------------------------


def test_a_child_is_launched_with_its_parents_run_id_and_output_dir(parent, backend):
    end(backend, "OK", 0)
    child = children(parent)["eval"]
    attempt = with_attempt(child, S.SUBMITTED)
    env = launch_spec(child, attempt).env
    assert env["SF_PARENT_RUN_ID"] == parent.run_id
    assert env["SF_PARENT_OUTPUT_DIR"] == str(settings.SF_OUTPUT_ROOT / parent.run_id)
    assert env["SF_OUTPUT_DIR"] == str(settings.SF_OUTPUT_ROOT / child.run_id)
    assert env["SF_RUN_ID"] == child.run_id


def test_a_job_without_a_parent_gets_no_parent_variables(parent, backend):
    attempt = parent.current_attempt
    env = launch_spec(parent, attempt).env
    assert "SF_PARENT_RUN_ID" not in env and "SF_PARENT_OUTPUT_DIR" not in env
