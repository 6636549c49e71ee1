"""The runner's sandbox (`sf.sandbox`): what bwrap is asked for, and how a stop reaches a job
inside it (its SIGTERM, never the helpers'), on a real sandbox when the tests run as root."""

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sf.contract import SANDBOX_VAR
from sf.sandbox import Sandbox, SandboxConfig, SandboxError, holder_argv
from sf.supervise import descendants

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root")


def pairs(argv: list[str], flag: str) -> list[tuple[str, ...]]:
    """Every occurrence of `flag` with the arguments it takes."""
    width = {"--bind": 2, "--ro-bind": 2, "--dev-bind": 2, "--tmpfs": 1, "--dir": 1}[flag]
    return [tuple(argv[i + 1 : i + 1 + width]) for i, a in enumerate(argv) if a == flag]


def test_the_holder_masks_the_hosts_sockets_and_temporary_files_and_binds_the_jobs_back():
    config = SandboxConfig(199_999, ("/dev/nvidia0",))
    argv = holder_argv(config, ["/tmp/state/a1/work", "/srv/runs/r1"], ["/tmp/venv", "/usr"])
    assert argv[:5] == [
        "bwrap",
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
    ]
    assert pairs(argv, "--tmpfs") == [("/dev/shm",), ("/tmp",), ("/var/tmp",), ("/run",)]
    assert pairs(argv, "--dev-bind") == [("/dev/nvidia0", "/dev/nvidia0")]
    # Only what a mask hides comes back; the job's folders always, after the masks.
    assert pairs(argv, "--ro-bind") == [("/tmp/venv", "/tmp/venv")]
    assert pairs(argv, "--bind")[1:] == [
        ("/tmp/state/a1/work", "/tmp/state/a1/work"),
        ("/srv/runs/r1", "/srv/runs/r1"),
    ]
    assert argv.index("--ro-bind") > argv.index("/run")
    # The folders on the way inside a mask: traversable, not listable.
    assert pairs(argv, "--dir") == [("/tmp/state",), ("/tmp/state/a1",)]
    assert argv[argv.index("/tmp/state") - 2 : argv.index("/tmp/state")] == ["0711", "--dir"]
    anchor = argv[argv.index("--", argv.index("/srv/runs/r1")) + 1 :]
    assert (
        anchor[0] == "setpriv"
        and "--regid=199999" in anchor
        and anchor[-2:] == ["sleep", "infinity"]
    )


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[]",
        "{}",
        '{"net_gid": 0}',
        '{"net_gid": true}',
        '{"net_gid": 5, "devices": ["rel"]}',
        '{"net_gid": 5, "software": "/opt/envs"}',
        '{"net_gid": 5, "software": ["envs"]}',
    ],
)
def test_a_malformed_sandbox_request_is_refused_with_a_sentence(raw):
    with pytest.raises(SandboxError, match=SANDBOX_VAR):
        SandboxConfig.from_environ({SANDBOX_VAR: raw})


def test_the_operators_software_under_a_mask_is_bound_back_read_only():
    """SF_SANDBOX_SOFTWARE's folders reach the runner as `software`: a job's own Python under
    /tmp (a checkout there, as CI's) runs in the sandbox, and nothing else of /tmp shows."""
    raw = json.dumps({"net_gid": 7, "software": ["/tmp/ci/.venv-jobs"]})
    config = SandboxConfig.from_environ({SANDBOX_VAR: raw})
    assert config == SandboxConfig(7, (), ("/tmp/ci/.venv-jobs",))
    argv = holder_argv(config, [], list(config.software))
    bound = argv.index("/tmp/ci/.venv-jobs")
    assert argv[bound - 1] == "--ro-bind" and argv[bound + 1] == "/tmp/ci/.venv-jobs"
    assert argv.index("--tmpfs") < bound  # over the mask, not under it


def test_no_request_no_sandbox():
    assert SandboxConfig.from_environ({}) is None
    assert SandboxConfig.from_environ({SANDBOX_VAR: json.dumps({"net_gid": 7})}) == SandboxConfig(7)


# A runner's part, in a process of its own: the supervisor signals every process below the
# process it runs in, which must not be pytest's (its servers are below it).
STOP_IN_A_SANDBOX = """
import json, os, signal, subprocess, sys
from sf.sandbox import Sandbox, SandboxConfig
from sf.supervise import Supervisor, descendants
work, job = sys.argv[1], sys.argv[2]
sandbox = Sandbox.open(SandboxConfig(199_999), [work + "/work"], work)
try:
    argv = sandbox.enter([sys.executable, "-c", job], work + "/work", 200_001, 200_001)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    sandbox.adopt(proc.pid)
    up = proc.stdout.readline()
    supervisor = Supervisor([proc], spared=sandbox.helpers)
    supervisor._forward(signal.SIGTERM, None)
    code = proc.wait(timeout=10)
    said = proc.stdout.readline()
    helpers_alive = sandbox.holder.poll() is None and sandbox.net.poll() is None
    anchor_alive = sandbox.anchor in descendants(os.getpid())
    supervisor.end_leftovers([])
finally:
    sandbox.close()
print(json.dumps({
    "up": up, "code": code, "said": said, "helpers_alive": helpers_alive,
    "anchor_alive": anchor_alive, "left": descendants(os.getpid()),
}))
"""
TRAPS_TERM = """
import signal, sys, time
def save(*_):
    print("saving", flush=True)
    sys.exit(3)
signal.signal(signal.SIGTERM, save)
print("up", flush=True)
time.sleep(60)
"""


@pytest.fixture
def work():
    root = Path(tempfile.mkdtemp(prefix="sf-sbx-"))
    root.chmod(0o711)
    (root / "work").mkdir()
    os.chown(root / "work", 200_001, 200_001)
    yield root
    (root / "work").rmdir()
    for leftover in root.iterdir():
        leftover.unlink()
    root.rmdir()


@as_root
def test_a_stop_reaches_the_job_alone_and_its_exit_status_comes_back(work):
    done = subprocess.run(
        [sys.executable, "-c", STOP_IN_A_SANDBOX, str(work), TRAPS_TERM],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    seen = json.loads(done.stdout)
    assert seen["up"] == "up\n" and seen["said"] == "saving\n"
    assert seen["code"] == 3  # the job's own exit, passed on by nsenter
    # The sandbox's own processes had no SIGTERM: they outlived the job, until its close.
    assert seen["helpers_alive"] and seen["anchor_alive"]
    assert seen["left"] == []


@as_root
def test_a_job_killed_by_a_signal_reads_as_killed_by_that_signal(work):
    sandbox = Sandbox.open(SandboxConfig(199_999), [str(work / "work")], str(work))
    try:
        code = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
        argv = sandbox.enter([sys.executable, "-c", code], str(work / "work"), 200_001, 200_001)
        assert subprocess.run(argv, check=False).returncode == -signal.SIGSEGV
    finally:
        sandbox.close()


@as_root
def test_a_sandbox_that_cannot_be_made_says_why(work):
    config = SandboxConfig(199_999, ("/dev/no-such-device",))
    with pytest.raises(SandboxError, match="bwrap exited"):
        Sandbox.open(config, [str(work / "work")], str(work))
    assert not [p for p in descendants(os.getpid()) if "/dev/no-such-device" in _cmdline(p)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""
