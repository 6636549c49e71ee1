"""The job-side runner: safe unpacking, log shipping through failures, exit files, signals."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sf import http, ingest, runner, shipping, supervise

from tests.client.helpers import exit_record, pack, run_runner, runner_env


def tar_with(path: Path, name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        tar.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    return path


@pytest.mark.parametrize("name", ["../evil.py", "a/../../evil.py", "/etc/evil"])
def test_unpack_refuses_paths_leaving_the_run_dir(tmp_path: Path, name: str) -> None:
    with pytest.raises(ingest.IngestError, match="unsafe path"):
        ingest.safe_unpack(str(tar_with(tmp_path / "s.tgz", name)), str(tmp_path / "run"))
    assert not (tmp_path / "evil.py").exists()


def test_unpack_refuses_symlink_pointing_outside(tmp_path: Path) -> None:
    archive = tar_with(tmp_path / "s.tgz", "link", tarfile.SYMTYPE, "../../etc/passwd")
    with pytest.raises(ingest.IngestError, match="outside"):
        ingest.safe_unpack(str(archive), str(tmp_path / "run"))


def test_unpack_refuses_two_links_that_leave_the_run_dir_together(tmp_path: Path) -> None:
    archive = tmp_path / "s.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, link in (("a", "c/.."), ("c", ".")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
    with pytest.raises(ingest.IngestError, match="symlink 'a' resolves outside"):
        ingest.safe_unpack(str(archive), str(tmp_path / "run"))
    assert not (tmp_path / "run" / "a").exists()


def test_unpack_creates_folders_the_archive_does_not_list(tmp_path: Path) -> None:
    ingest.safe_unpack(str(tar_with(tmp_path / "s.tgz", "a/b/c.py")), str(tmp_path / "run"))
    assert (tmp_path / "run" / "a" / "b" / "c.py").is_file()


def test_unpack_refuses_device_files(tmp_path: Path) -> None:
    archive = tar_with(tmp_path / "s.tgz", "dev", tarfile.CHRTYPE)
    with pytest.raises(ingest.IngestError, match="unsupported member"):
        ingest.safe_unpack(str(archive), str(tmp_path / "run"))


JOB_SCRIPT = """\
import sys
for i in range(40):
    print(f"out {i}")
    if i % 10 == 0:
        print(f"err {i}", file=sys.stderr)
sys.exit(7)
"""


class LogSink:
    """Fake ingest endpoint: fails the first `fail` POSTs with 503, then dedupes by seq."""

    def __init__(self, fail: int = 2) -> None:
        self.fail, self.stored, self.posts, self.duplicates = fail, {}, 0, 0

    def __call__(self, req: Any) -> tuple[int, Any]:
        self.posts += 1
        if self.posts <= self.fail:
            return 503, {"detail": "database is busy."}
        body = req.json()
        new = [ln for ln in body["lines"] if ln["seq"] not in self.stored]
        for line in new:
            self.stored[line["seq"]] = line
        self.duplicates += len(body["lines"]) - len(new)
        next_seq = max(self.stored, default=-1) + 1
        return 200, {
            "accepted": len(new),
            "duplicates": len(body["lines"]) - len(new),
            "next_seq": next_seq,
        }


def test_runner_ships_every_line_once_through_503s_and_records_exit(
    fake_api: Any, tmp_path: Path
) -> None:
    sha, data = pack(tmp_path, {"job.py": JOB_SCRIPT})
    logs = LogSink(fail=2)
    fake_api.route("GET /api/v1/ingest/snapshot", lambda r: (200, data))
    fake_api.route("POST /api/v1/ingest/logs", logs)
    env = runner_env(tmp_path, fake_api.url, sha, [sys.executable, "job.py"])
    result = run_runner(env)
    assert result.returncode == 7, result.stderr
    record = exit_record(env)
    assert (record["exit_code"], record["reason"]) == (7, "")
    assert record["ended_at"] >= record["started_at"]
    assert sorted(logs.stored) == list(range(44))  # 40 stdout + 4 stderr, no gaps
    assert logs.posts >= 3 and logs.duplicates == 0
    texts = [logs.stored[i]["text"] for i in range(44)]
    assert [t for t in texts if t.startswith("out")] == [f"out {i}" for i in range(40)]
    assert {logs.stored[i]["stream"] for i in range(44)} == {"stdout", "stderr"}
    assert all(r.headers["Authorization"] == "Bearer job-tok" for r in fake_api.requests)
    started = json.loads(Path(env["SF_STARTED_FILE"]).read_text())
    assert started["pid"] > 0
    console = (Path(env["SF_EXIT_FILE"]).parent / "console.log").read_text().splitlines()
    assert len(console) == 44 and (tmp_path / "ckpt").is_dir() and (tmp_path / "out").is_dir()


def test_runner_reports_the_entrypoints_start_once_through_a_503(
    fake_api: Any, tmp_path: Path
) -> None:
    sha, data = pack(tmp_path, {"job.py": "import time; time.sleep(2)\n"})
    answers = iter([(503, {"detail": "busy"}), (200, {"start_time": "2026-01-01T00:00:00Z"})])
    fake_api.route("GET /api/v1/ingest/snapshot", lambda r: (200, data))
    fake_api.route("POST /api/v1/ingest/started", lambda r: next(answers))
    env = runner_env(tmp_path, fake_api.url, sha, [sys.executable, "job.py"])
    assert run_runner(env).returncode == 0
    sent = [r for r in fake_api.requests if r.path == "/api/v1/ingest/started"]
    assert [r.json() for r in sent] == [{"attempt": 1}, {"attempt": 1}]


def test_runner_never_sends_a_line_twice_after_success(fake_api: Any, tmp_path: Path) -> None:
    sha, data = pack(tmp_path, {"job.py": JOB_SCRIPT})
    batches: list[list[int]] = []

    def record(req: Any) -> tuple[int, Any]:
        seqs = [ln["seq"] for ln in req.json()["lines"]]
        batches.append(seqs)
        return 200, {"accepted": len(seqs), "duplicates": 0, "next_seq": seqs[-1] + 1}

    fake_api.route("GET /api/v1/ingest/snapshot", lambda r: (200, data))
    fake_api.route("POST /api/v1/ingest/logs", record)
    env = runner_env(tmp_path, fake_api.url, sha, [sys.executable, "job.py"])
    assert run_runner(env).returncode == 7
    assert sorted(s for b in batches for s in b) == list(range(44))


def test_snapshot_404_is_an_ingest_failure(fake_api: Any, tmp_path: Path) -> None:
    fake_api.route("GET /api/v1/ingest/snapshot", lambda r: (404, {"detail": "no snapshot."}))
    env = runner_env(tmp_path, fake_api.url, "ab" * 32, [sys.executable, "job.py"])
    result = run_runner(env)
    assert result.returncode == runner.INGEST_EXIT
    record = exit_record(env)
    assert record["exit_code"] is None and record["reason"].startswith("ingest failed")
    assert "no snapshot." in record["reason"]
    assert not Path(env["SF_STARTED_FILE"]).exists()


def test_missing_entrypoint_executable_is_an_ingest_failure(tmp_path: Path) -> None:
    env = runner_env(tmp_path, "", "", ["definitely-not-a-command-sf"])
    assert run_runner(env).returncode == runner.INGEST_EXIT
    assert "not found" in exit_record(env)["reason"]


def test_sigterm_is_forwarded_and_recorded(tmp_path: Path) -> None:
    script = "import time; print('ready', flush=True); time.sleep(30)"
    env = runner_env(tmp_path, "", "", [sys.executable, "-c", script])
    proc = subprocess.Popen(
        [sys.executable, "-m", "sf.runner"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert time.monotonic() - started < 5
    record = exit_record(env)
    assert (record["exit_code"], record["reason"]) == (-15, "killed by signal 15")


def test_sigterm_during_ingest_still_writes_exit_file(fake_api: Any, tmp_path: Path) -> None:
    def slow(req: Any) -> tuple[int, Any]:
        time.sleep(5)
        return 503, {"detail": "slow."}

    fake_api.route("GET /api/v1/ingest/snapshot", slow)
    env = runner_env(tmp_path, fake_api.url, "ab" * 32, [sys.executable, "job.py"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "sf.runner"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while not fake_api.requests and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    assert exit_record(env)["reason"] == "killed by signal 15"


class ScriptedClient:
    """Stands in for sf.http.Client: raises or answers per call, recording batches."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers, self.batches = answers, []

    def request(self, method: str, path: str, json_body: Any = None, **_: Any) -> Any:
        self.batches.append([ln["seq"] for ln in json_body["lines"]])
        answer = self.answers.pop(0) if self.answers else {"next_seq": -1}
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_conflict_drops_lines_the_server_already_has(monkeypatch: pytest.MonkeyPatch) -> None:
    from sf.http import ApiError

    monkeypatch.setattr(shipping, "BATCH_INTERVAL_S", 0.01)
    client = ScriptedClient([ApiError(409, "gap.", {"next_seq": 3})])
    shipper = shipping.LogShipper(client, attempt=1)  # type: ignore[arg-type]
    for seq in range(5):
        shipper.add({"seq": seq, "stream": "stdout", "ts": 0.0, "text": str(seq)})
    shipper.start()
    shipper.close()
    assert client.batches == [[0, 1, 2, 3, 4], [3, 4]]
    assert shipper.buffer == []


def test_revoked_token_stops_shipping(capfd: pytest.CaptureFixture) -> None:
    from sf.http import ApiError

    client = ScriptedClient([ApiError(410, "job finished.")])
    shipper = shipping.LogShipper(client, attempt=1)  # type: ignore[arg-type]
    shipper.add({"seq": 0, "stream": "stdout", "ts": 0.0, "text": "x"})
    shipper.start()
    shipper.close()
    shipper.add({"seq": 1, "stream": "stdout", "ts": 0.0, "text": "y"})
    assert client.batches == [[0]] and shipper.buffer == []
    assert "HTTP 410" in capfd.readouterr().err


def test_a_batch_too_large_is_resent_in_halves_then_grows_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sf.http import ApiError

    monkeypatch.setattr(shipping, "BATCH_INTERVAL_S", 0.01)
    too_large = ApiError(413, "the batch is larger than 16 MB.")
    client = ScriptedClient([too_large, too_large, {}, {}, {}])
    shipper = shipping.LogShipper(client, attempt=1)  # type: ignore[arg-type]
    for seq in range(8):
        shipper.add({"seq": seq, "stream": "stdout", "ts": 0.0, "text": str(seq)})
    shipper.start()
    shipper.close()
    assert client.batches == [list(range(8)), [0, 1, 2, 3], [0, 1], [2, 3, 4, 5], [6, 7]]
    assert shipper.buffer == [] and not shipper.stopped


def test_one_record_too_large_alone_is_dropped_and_the_rest_shipped(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    from sf.http import ApiError

    monkeypatch.setattr(shipping, "BATCH_INTERVAL_S", 0.01)
    too_large = ApiError(413, "the batch is larger than 16 MB.")
    client = ScriptedClient([too_large, too_large, {}])
    shipper = shipping.LogShipper(client, attempt=1)  # type: ignore[arg-type]
    for seq in range(2):
        shipper.add({"seq": seq, "stream": "stdout", "ts": 0.0, "text": str(seq)})
    shipper.start()
    shipper.close()
    assert client.batches == [[0, 1], [0], [1]]
    assert shipper.buffer == [] and not shipper.stopped
    assert "dropped one of the log lines (seq 0): the batch is larger" in capfd.readouterr().err


# --- trust boundaries (issue 12) --------------------------------------------------------

PRINT_ENV = "import json, os; print(json.dumps(dict(os.environ)), flush=True)"
RUNNER_ONLY = {
    "SF_JOB_TOKEN",
    "SF_BOOTSTRAP_TOKEN",
    "SF_RECORD_KEY",
    "SF_EXIT_FILE",
    "SF_STARTED_FILE",
    "SF_PROC_FILE",
    "SF_API_URL",
    "SF_USER_ENV",
}


def job_env_of(result: subprocess.CompletedProcess) -> dict:
    return json.loads(result.stdout.splitlines()[0])


def test_with_sf_user_env_the_job_gets_the_base_its_env_and_the_contract_only(
    tmp_path: Path,
) -> None:
    env = runner_env(tmp_path, "", "", [sys.executable, "-c", PRINT_ENV])
    env = {k: v for k, v in env.items() if k.startswith("SF_")} | {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "DATABASE_URL": "postgres://secret",
        "SF_RECORD_KEY": "k" * 64,
        "SF_PARENT_RUN_ID": "r6",
        "SF_ARRAY_INDEX": "3",
        "SF_ARRAY_PARAMS": '{"lr": 0.1}',
        "SF_USER_ENV": json.dumps({"MINE": "1", "SF_JOB_TOKEN": "smuggled"}),
    }
    result = run_runner(env)
    assert result.returncode == 0, result.stderr
    seen = job_env_of(result)
    assert seen["MINE"] == "1" and seen["SF_PARENT_RUN_ID"] == "r6" and seen["SF_RUN_ID"] == "r7"
    assert (seen["SF_ARRAY_INDEX"], seen["SF_ARRAY_PARAMS"]) == ("3", '{"lr": 0.1}')
    assert not set(seen) & (RUNNER_ONLY | {"DATABASE_URL", "SF_ENTRYPOINT", "SF_SNAPSHOT"})
    assert seen["SF_METRICS_FILE"].endswith("metrics.jsonl")


def test_without_sf_user_env_the_job_gets_the_runners_env_without_its_secrets(
    tmp_path: Path,
) -> None:
    env = runner_env(tmp_path, "", "", [sys.executable, "-c", PRINT_ENV])
    env.update({"SF_RECORD_KEY": "k" * 64, "SF_BOOTSTRAP_TOKEN": "boot", "MINE": "1"})
    result = run_runner(env)
    seen = job_env_of(result)
    assert seen["MINE"] == "1" and seen["SF_JOB_ID"] == "7"
    assert not set(seen) & RUNNER_ONLY


def test_records_are_signed_with_the_record_key_in_the_servers_canonical_form(
    tmp_path: Path,
) -> None:
    import hashlib
    import hmac

    env = runner_env(tmp_path, "", "", [sys.executable, "-c", "pass"])
    env["SF_RECORD_KEY"] = "record-key"
    assert run_runner(env).returncode == 0
    for path in (env["SF_STARTED_FILE"], env["SF_EXIT_FILE"]):
        record = json.loads(Path(path).read_text())
        body = {k: v for k, v in record.items() if k != "mac"}
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        assert record["mac"] == hmac.new(b"record-key", canonical, hashlib.sha256).hexdigest()


def test_without_a_record_key_records_are_unsigned(tmp_path: Path) -> None:
    env = runner_env(tmp_path, "", "", [sys.executable, "-c", "pass"])
    assert run_runner(env).returncode == 0
    assert "mac" not in exit_record(env)


DOUBLE_FORK = """
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(os.getpid(), flush=True)
        time.sleep(60)
    os._exit(0)
time.sleep(0.5)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_runner_ends_what_the_job_left_behind_before_its_exit_record(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = runner_env(tmp_path, "", "", [sys.executable, "-c", DOUBLE_FORK])
    result = run_runner(env)  # the detached one ignores SIGTERM: SIGKILL after the grace
    detached = int(result.stdout.split()[0])
    assert result.returncode == 0 and not alive(detached)
    assert exit_record(env)["ended_at"] - exit_record(env)["started_at"] >= supervise.KILL_GRACE_S


def test_sigterm_ends_a_detached_process_of_the_job_too(tmp_path: Path) -> None:
    script = DOUBLE_FORK.replace("time.sleep(0.5)", "time.sleep(60)")
    script = script.replace("signal.signal(signal.SIGTERM, signal.SIG_IGN)", "pass")
    env = runner_env(tmp_path, "", "", [sys.executable, "-c", script])
    proc = subprocess.Popen(
        [sys.executable, "-m", "sf.runner"], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    detached = int(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert not alive(detached)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the runner as another uid")
def test_a_job_of_the_runners_uid_cannot_read_its_environ(tmp_path: Path) -> None:
    import tempfile

    probe = (
        "import os\n"
        "try:\n    open(f'/proc/{os.getppid()}/environ', 'rb').read()\n    print('read')\n"
        "except PermissionError:\n    print('refused')\n"
    )
    folder = Path(tempfile.mkdtemp(prefix="sf-dumpable-"))
    folder.chmod(0o777)
    for parent in Path(os.path.realpath(sys.executable)).parents:
        parent.chmod(parent.stat().st_mode | 0o001)  # nobody must reach this interpreter
    env = runner_env(folder, "", "", [sys.executable, "-c", probe])
    (folder / "attempt-1").chmod(0o777)
    env["SF_RECORD_KEY"] = "record-key"
    result = subprocess.run(
        [sys.executable, "-I", "-m", "sf.runner"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        user=65534,
        group=65534,
        extra_groups=[],
        check=False,
    )
    assert result.stdout.splitlines() == ["refused"], result.stderr


def test_a_bootstrap_token_is_exchanged_first_through_a_429(fake_api: Any, tmp_path: Path) -> None:
    answers = iter([(429, {"detail": "slow down."}), (200, {"token": "real-token"})])
    fake_api.route("POST /api/v1/ingest/token", lambda r: next(answers))
    fake_api.route("POST /api/v1/ingest/logs", lambda r: (200, {"next_seq": 1}))
    env = runner_env(tmp_path, fake_api.url, "", [sys.executable, "-c", "print('hi')"])
    del env["SF_JOB_TOKEN"]
    env["SF_BOOTSTRAP_TOKEN"] = "boot-token"
    assert run_runner(env).returncode == 0
    exchange = [r for r in fake_api.requests if r.path == "/api/v1/ingest/token"]
    assert [r.json() for r in exchange] == [{"attempt": 1}, {"attempt": 1}]
    assert {r.headers["Authorization"] for r in exchange} == {"Bearer boot-token"}
    rest = [r for r in fake_api.requests if r.path != "/api/v1/ingest/token"]
    assert rest and {r.headers["Authorization"] for r in rest} == {"Bearer real-token"}


def test_a_refused_bootstrap_token_is_an_ingest_failure(fake_api: Any, tmp_path: Path) -> None:
    fake_api.route("POST /api/v1/ingest/token", lambda r: (403, {"detail": "already spent."}))
    env = runner_env(tmp_path, fake_api.url, "", [sys.executable, "-c", "print('never')"])
    del env["SF_JOB_TOKEN"]
    env["SF_BOOTSTRAP_TOKEN"] = "boot-token"
    assert run_runner(env).returncode == runner.INGEST_EXIT
    reason = exit_record(env)["reason"]
    assert reason == "ingest failed: token exchange: HTTP 403: already spent."


def test_a_429_on_the_snapshot_download_is_retried(fake_api: Any, tmp_path: Path) -> None:
    sha, data = pack(tmp_path, {"job.py": "print('ran')\n"})
    answers = iter([(429, {"detail": "too many requests."}), (200, data)])
    fake_api.route("GET /api/v1/ingest/snapshot", lambda r: next(answers))
    env = runner_env(tmp_path, fake_api.url, sha, [sys.executable, "job.py"])
    result = run_runner(env)
    assert result.returncode == 0, result.stderr
    assert "ran" in result.stdout


class FailingThenOk:
    def __init__(self, errors: list[Exception]) -> None:
        self.errors, self.calls = errors, 0

    def download(self, path: str, fh: Any) -> int:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return 0


def test_retry_after_is_honoured_up_to_its_cap(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sf.http import ApiError

    slept: list[float] = []
    real_sleep, here = time.sleep, threading.get_ident()

    def sleep(seconds: float) -> None:
        # ingest.time is the time module: other threads of the suite's process (a fixture's
        # poller) must still sleep, and their sleeps are not the download's.
        if threading.get_ident() == here:
            slept.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(ingest.time, "sleep", sleep)
    errors = [ApiError(429, "wait.", retry_after=7.0), ApiError(503, "wait.", retry_after=3600.0)]
    client = FailingThenOk(errors)
    ingest._download(client, str(tmp_path / "a.tgz"))  # type: ignore[arg-type]
    assert client.calls == 3 and slept == [7.0, http.RETRY_AFTER_CAP_S]


def _niceness_after(start: int, wanted: str) -> tuple[int, str]:
    """A process at niceness `start` asks to take back `wanted`: where it ends, what it said."""
    code = (
        "import os, sys; os.nice(int(sys.argv[1]))\n"
        "from sf.runner import take_back_priority\n"
        "take_back_priority(sys.argv[2]); print(os.getpriority(os.PRIO_PROCESS, 0))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(start), wanted], capture_output=True, text=True, check=True
    )
    return int(done.stdout), done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="raising a priority back needs root")
def test_the_runner_takes_back_the_workers_priority_for_the_job() -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert _niceness_after(10, str(base)) == (base, "")
    # Never lower than it is: a runner started at its own niceness stays there.
    assert _niceness_after(0, str(base + 5))[0] == base
    ended, said = _niceness_after(10, "ten")
    assert ended == min(19, base + 10) and "not an integer" in said
