"""A GPU job still gets its device nodes in its sandbox (issue 47, point 1).

The sandbox's /dev is a minimal one (null, zero, random, tty, shm ...) plus the GPU device
nodes the executor names (`SF_SANDBOX_DEVICES`, /dev/nvidia* by default). With no GPU here,
the test makes stand-ins: character devices aliasing /dev/null, as the Slurm suite's fake
GRES do, and a job opens them.
"""

import json
import os
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from tests.factories import queued_job
from tests.local_jobs import finished, run_until, start, texts

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("local_jobs"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs the server to run as root"),
]

LOOK = """
import json, os, stat
found = {}
for name in sorted(os.listdir("/dev")):
    try:
        mode = os.stat(f"/dev/{name}").st_mode
    except OSError:
        continue
    found[name] = "char" if stat.S_ISCHR(mode) else "other"
with open("/dev/nvidia1", "rb") as device:
    device.read(1)
print(json.dumps(found), flush=True)
"""


@pytest.fixture
def fake_gpus(settings):
    folder = Path(tempfile.mkdtemp(prefix="sf-devs-", dir="/var/tmp"))
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        os.mknod(folder / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        (folder / name).chmod(0o666)  # whatever the umask: the job's uid opens it
    (folder / "nvidia-not-a-device").write_text("")
    settings.SF_SANDBOX_DEVICES = f"{folder}/nvidia*"
    yield folder
    for entry in folder.iterdir():
        entry.unlink()
    folder.rmdir()


def test_a_job_gets_the_gpu_device_nodes_and_a_minimal_dev(fake_gpus, team, alice):
    job = queued_job(team, alice, total_gpus=2, entrypoint=[sys.executable, "-c", LOOK])
    start(job)
    run_until(lambda: finished(job), timeout=60)
    job.refresh_from_db()
    assert job.status == "SUCCEEDED", job.status_reason
    found = json.loads(texts(job)[0])
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        assert found.pop(name) == "char"
    assert "nvidia-not-a-device" not in found
    # bwrap's minimal /dev: nothing of the host's disks or consoles.
    assert set(found) <= {
        "null",
        "zero",
        "full",
        "random",
        "urandom",
        "tty",
        "console",
        "ptmx",
        "pts",
        "shm",
        "fd",
        "stdin",
        "stdout",
        "stderr",
        "core",
        "mqueue",
    }, found
