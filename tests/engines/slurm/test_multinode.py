"""Multi-node jobs on a real two-node Slurm: the `multi` partition of `.ci/slurm.sh`, two slurmd
on this host (multi1 at 127.0.0.2, multi2 at 127.0.0.3) with two fake a100 GPUs each.

A job of N nodes is one batch job (`--nodes N --ntasks-per-node 1`) whose batch step, on the
first node, is the one runner of the attempt: it starts one srun step per rank, ends every rank
when one fails, and signs the ranks into its records, which the executor's poll passes on.
"""

import json
import os
import time
from pathlib import Path

import pytest
from sf.contract import RECORD_KEY_VAR

from jobs.executors import LaunchError, LaunchSpec, NodeCapacity
from jobs.executors.base import record_key
from jobs.executors.slurm import SlurmExecutor
from jobs.executors.slurm.parse import (
    expand_hostlist,
    gpu_count,
    gpu_gres_type,
    usable_node_state,
)
from jobs.loops.launcher import launch_attempts
from jobs.loops.reconciler import reconcile_all
from jobs.loops.scheduler import admit_queued_jobs
from jobs.models import Cluster, Job
from jobs.states import JobStatus
from tests.engines.slurm.conftest import slurm
from tests.engines.slurm.helpers import FINAL, FakeSlurm, wait_for

pytestmark = pytest.mark.slurm
S = JobStatus
MULTI = ("multi1", "multi2")
CONTRACT = (
    "SF_NODE_RANK SF_NUM_NODES SF_GPUS_PER_NODE SF_MASTER_ADDR SF_MASTER_PORT SF_NODE_ADDRS "
    "MASTER_ADDR MASTER_PORT NODE_RANK WORLD_SIZE PET_NNODES PET_NODE_RANK PET_NPROC_PER_NODE "
    "PET_MASTER_ADDR PET_MASTER_PORT CUDA_VISIBLE_DEVICES SLURMD_NODENAME"
).split()
# One rank. "talk": rank 0 listens at MASTER_ADDR:MASTER_PORT, the other ranks connect and
# say who they are; then each writes what it saw to rank<N>.json and stays `hold` seconds.
# "fail": rank 0 writes its pid and sleeps (a SIGTERM it notes in rank0.term, then exits: the
# grace a rank gets to save its state); rank 1 waits for the pid, then exits 3.
RANK = f"""
import json, os, signal, socket, sys, time
mode, out, hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
rank = int(os.environ["SF_NODE_RANK"])
seen = {{k: os.environ.get(k) for k in {CONTRACT!r}}}
seen.update(pid=os.getpid(), start=time.time())
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if mode == "fail":
    if rank == 0:
        def noted(*_):
            open(f"{{out}}/rank0.term", "w").write("TERM")
            sys.exit(143)
        signal.signal(signal.SIGTERM, noted)
        open(f"{{out}}/rank0.pid", "w").write(str(os.getpid()))
        time.sleep(300)
    while not os.path.exists(f"{{out}}/rank0.pid"):
        time.sleep(0.05)
    open(f"{{out}}/failed_at", "w").write(repr(time.time()))
    sys.exit(3)
if rank == 0:
    server = socket.create_server((addr, port))
    server.settimeout(60)
    heard = []
    for _ in range(int(os.environ["SF_NUM_NODES"]) - 1):
        conn, _peer = server.accept()
        heard.append(conn.recv(200).decode())
        conn.sendall(b"welcome")
    seen["heard"] = heard
else:
    deadline = time.time() + 60
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
    conn.sendall(f"rank {{rank}} on {{seen['SLURMD_NODENAME']}}".encode())
    seen["heard"] = [conn.recv(200).decode()]
seen["end"] = time.time()
json.dump(seen, open(f"{{out}}/rank{{rank}}.json", "w"))
time.sleep(hold)
"""


@pytest.fixture
def multi(cluster_settings) -> SlurmExecutor:
    """An executor on the `multi` partition of the test cluster (row not saved)."""
    settings = {**cluster_settings, "partition": "multi"}
    return SlurmExecutor(Cluster(name="slurm-multi", kind="slurm", settings=settings))


@pytest.fixture
def multi_idle(slurm_conf) -> None:
    """Wait until both multi nodes take jobs and no job holds a GPU there."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = slurm("sinfo", "-h", "-N", "-p", "multi", "-O", "NodeList:|,StateLong:|,GresUsed:|",
                    conf=slurm_conf)  # fmt: skip
        rows = [line.split("|") for line in out.splitlines() if line.strip()]
        if sorted(r[0] for r in rows) == list(MULTI) and all(
            usable_node_state(r[1]) and gpu_count(r[2]) == 0 for r in rows
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"the multi nodes stayed unusable or their GPUs busy: {out.strip()}")


@pytest.fixture
def rank_script(tmp_path) -> Path:
    path = tmp_path / "rank.py"
    path.write_text(RANK)
    return path


def gang_spec(token: str, label: str, argv: list[str], nodes=2, gpus_per_node=2, **fields):
    """A launch of `argv` on `nodes` nodes (offline runner: no API, no snapshot), with the key
    its runner signs its records with, as the launcher gives it."""
    run_id = f"{token}{label}"
    name = f"sf-{run_id}-a1"
    env = {
        "SF_API_URL": "",
        "SF_SNAPSHOT": "",
        "SF_ENTRYPOINT": json.dumps(argv),
        RECORD_KEY_VAR: record_key(name),
    }
    return LaunchSpec(
        name=name,
        job_id=1,
        run_id=run_id,
        attempt=1,
        total_gpus=nodes * gpus_per_node,
        entrypoint=argv,
        env=env,
        nodes=nodes,
        **fields,
    )


def gang_job(team, user, run_id: str, argv: list[str], nodes: int, gpus_per_node: int) -> Job:
    return Job.objects.create(
        run_id=run_id,
        team=team,
        user=user,
        cluster=team.default_cluster,
        total_gpus=nodes * gpus_per_node,
        nodes=nodes,
        gpu_type="a100",
        entrypoint=argv,
    )


def wait_until(check, timeout: float = 30, what: str = "it"):
    """check()'s first true answer, polled until `timeout`."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout} s"
        time.sleep(0.05)
    return found


def text_of(path: Path, what: str) -> str:
    """The file's text once a rank has written it."""
    return wait_until(lambda: path.exists() and path.read_text(), what=what)


def ranks_reported(out: Path) -> list[dict]:
    """What each rank of a "talk" job saw, once both have written it."""
    return [json.loads(text_of(out / f"rank{r}.json", f"rank {r} reporting")) for r in (0, 1)]


def slurm_state(ref: str, conf: str) -> str:
    return slurm("squeue", "-h", "-t", "all", "-j", ref, "-o", "%T", conf=conf).strip()


def node_addrs(conf: str) -> dict[str, str]:
    out = slurm("scontrol", "show", "node", "-o", ",".join(MULTI), conf=conf)
    fields = [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in out.splitlines()]
    return {f["NodeName"]: f["NodeAddr"] for f in fields}


def processes_running(marker: str) -> list[str]:
    """Command lines on this host (every node is) that mention `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline and pid != str(os.getpid()):
            found.append(f"{pid}: {cmdline}")
    return found


def job_fields(ref: str, conf: str) -> dict[str, str]:
    """scontrol's view of a job (NumNodes is "min-max" while it waits: "2-2")."""
    out = slurm("scontrol", "show", "job", "-o", ref, conf=conf)
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def test_both_ranks_run_at_once_on_two_nodes_with_the_contract_and_reach_rank_0(
    multi, token, multi_idle, rank_script, tmp_path, slurm_conf
):
    out = tmp_path / "ranks"
    out.mkdir()
    spec = gang_spec(token, "talk", ["python", str(rank_script), "talk", str(out), "3"])
    ref = multi.submit(spec)
    seen = ranks_reported(out)
    running = multi.poll([ref])[ref]
    assert running.native_state == "RUNNING"
    assert [(r["rank"], r["state"]) for r in running.details["ranks"]] == [
        (0, "running"),
        (1, "running"),
    ]
    nodes = [s["SLURMD_NODENAME"] for s in seen]
    assert sorted(nodes) == list(MULTI)  # one rank on each node
    assert [r["node"] for r in running.details["ranks"]] == nodes
    assert max(s["start"] for s in seen) < min(s["end"] for s in seen)  # at the same time
    addrs = node_addrs(slurm_conf)
    for rank, env in enumerate(seen):
        assert env["SF_NODE_RANK"] == env["NODE_RANK"] == env["PET_NODE_RANK"] == str(rank)
        assert env["SF_NUM_NODES"] == env["WORLD_SIZE"] == env["PET_NNODES"] == "2"
        assert env["SF_GPUS_PER_NODE"] == env["PET_NPROC_PER_NODE"] == "2"
        # rank 0's NodeAddr, and every node's in rank order
        assert env["MASTER_ADDR"] == env["SF_MASTER_ADDR"] == env["PET_MASTER_ADDR"]
        assert env["MASTER_ADDR"] == addrs[nodes[0]]
        assert env["SF_NODE_ADDRS"] == f"{addrs[nodes[0]]},{addrs[nodes[1]]}"
        assert env["MASTER_PORT"] == env["SF_MASTER_PORT"] == env["PET_MASTER_PORT"]
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # its own node's two GPUs, from its step
    assert seen[0]["heard"] == [f"rank 1 on {nodes[1]}"]  # over TCP, at MASTER_PORT
    assert seen[1]["heard"] == ["welcome"]
    final = wait_for(multi, ref, FINAL, timeout=30)[-1]
    assert (final.native_state, final.exit_code) == ("COMPLETED", 0)
    assert [r["state"] for r in final.details["ranks"]] == ["succeeded", "succeeded"]
    assert "failed_rank" not in final.details


def test_one_ranks_failure_fails_the_attempt_with_its_code_and_ends_the_other_rank(
    multi, token, multi_idle, rank_script, tmp_path
):
    out = tmp_path / "ranks"
    out.mkdir()
    spec = gang_spec(token, "fail", ["python", str(rank_script), "fail", str(out), "0"])
    ref = multi.submit(spec)
    pid = int(text_of(out / "rank0.pid", "rank 0 starting"))
    failed_at = float(text_of(out / "failed_at", "rank 1 failing"))
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), timeout=10, what="rank 0 ending")
    assert time.time() - failed_at < 10
    # Ended with a SIGTERM it could act on, not killed outright (srun alone would SIGKILL it).
    assert (out / "rank0.term").read_text() == "TERM"
    final = wait_for(multi, ref, FINAL, timeout=30)[-1]
    assert (final.native_state, final.exit_code, final.failure) == ("FAILED", 3, "exit")
    assert final.details["failed_rank"] == 1
    ranks = final.details["ranks"]
    assert [(r["rank"], r["state"]) for r in ranks] == [(0, "killed"), (1, "failed")]
    assert ranks[1]["exit_code"] == 3
    assert processes_running(str(rank_script)) == []  # no rank, and no srun, is left


def test_cancel_ends_every_rank_on_every_node(multi, token, multi_idle, rank_script, tmp_path):
    out = tmp_path / "ranks"
    out.mkdir()
    spec = gang_spec(token, "stop", ["python", str(rank_script), "talk", str(out), "300"])
    ref = multi.submit(spec)
    pids = [seen["pid"] for seen in ranks_reported(out)]
    multi.cancel(ref)  # one scancel of the job: every step, so every rank, ends with it
    for pid in pids:
        wait_until(lambda pid=pid: not os.path.exists(f"/proc/{pid}"), timeout=15,
                   what=f"rank pid {pid} ending")  # fmt: skip
    assert wait_for(multi, ref, FINAL, timeout=30)[-1].native_state == "CANCELLED"
    assert processes_running(str(rank_script)) == []


def test_capacity_reports_each_node_with_its_gpu_type_less_foreign_load(
    multi, token, multi_idle, slurm_conf, tmp_path, rank_script
):
    capacity = multi.capacity()
    assert capacity.reachable and capacity.total_gpus == 4
    assert capacity.nodes == (NodeCapacity("multi1", 2, "a100"), NodeCapacity("multi2", 2, "a100"))
    assert not capacity.ranks_share_nodes and capacity.gpu_types == ["a100"]
    foreign = slurm(
        "sbatch", "--parsable", f"--job-name=train-{token}", "-p", "multi", "-w", "multi1",
        "--gres=gpu:a100:1", f"--output={tmp_path}/foreign.out", "--wrap=sleep 60",
        conf=slurm_conf,
    ).strip()  # fmt: skip
    out = tmp_path / "ranks"
    out.mkdir()
    argv = ["python", str(rank_script), "talk", str(out), "60"]
    ours = multi.submit(gang_spec(token, "ours", argv, gpus_per_node=1))
    wait_for(multi, foreign, {"RUNNING"})
    wait_for(multi, ours, {"RUNNING"})
    capacity = multi.capacity()
    # Starforge's own 2 x 1 GPU are the scheduler's to subtract: only the foreign one counts
    assert capacity.nodes == (NodeCapacity("multi1", 1, "a100"), NodeCapacity("multi2", 2, "a100"))
    assert capacity.total_gpus == 3


def test_the_gpu_type_cpus_and_memory_go_to_sbatch_in_slurms_spelling(multi, token, slurm_conf):
    argv = ["python", "-c", "pass"]
    gang = multi.submit(
        gang_spec(token, "typed", argv, gpus_per_node=1, gpu_type="A100", cpus=2, memory_mb=512)
    )
    job = job_fields(gang, slurm_conf)
    assert (job["NumNodes"].split("-")[0], job["TresPerNode"]) == ("2", "gres:gpu:a100:1")
    assert (job["MinCPUsNode"], job["MinMemoryNode"]) == ("2", "512M")
    # each rank's step runs inside those limits (it inherits them from the batch step)
    final = wait_for(multi, gang, FINAL, timeout=30)[-1]
    assert final.native_state == "COMPLETED"
    assert [r["state"] for r in final.details["ranks"]] == ["succeeded", "succeeded"]
    one = multi.submit(gang_spec(token, "one", argv, nodes=1, gpus_per_node=2, gpu_type="a100"))
    job = job_fields(one, slurm_conf)
    assert (job["NumNodes"].split("-")[0], job["TresPerNode"]) == ("1", "gres:gpu:a100:2")
    with pytest.raises(LaunchError) as refused:
        multi.submit(gang_spec(token, "h100", argv, gpus_per_node=1, gpu_type="h100"))
    assert refused.value.permanent
    assert str(refused.value) == "sbatch: Requested node configuration is not available"


@pytest.mark.django_db
def test_gang_admission_waits_until_every_node_has_room(
    token, cluster_settings, multi_idle, make_team, make_user, settings, slurm_conf, tmp_path,
    rank_script,
):  # fmt: skip
    settings.SF_API_URL = ""  # offline runners: the ledger follows Slurm's reports alone
    cluster = Cluster.objects.create(
        name=f"multi-{token}", kind="slurm", settings={**cluster_settings, "partition": "multi"}
    )
    team = make_team("vision", gpu_quota=16, cluster=cluster)
    user = make_user("bob", team)
    foreign = slurm(
        "sbatch", "--parsable", f"--job-name=train-{token}", "-p", "multi", "-w", "multi1",
        "--gres=gpu:a100:2", f"--output={tmp_path}/foreign.out", "--wrap=sleep 120",
        conf=slurm_conf,
    ).strip()  # fmt: skip
    wait_until(lambda: slurm_state(foreign, slurm_conf) == "RUNNING", what="the foreign job")
    out = tmp_path / "ranks"
    out.mkdir()
    argv = ["python", str(rank_script), "talk", str(out), "60"]
    # 2 x 1 GPU: the cluster has the 2 GPUs free, but all on multi2
    gang = gang_job(team, user, f"{token}gang", argv, nodes=2, gpus_per_node=1)
    assert admit_queued_jobs().admitted == []
    gang.refresh_from_db()
    assert (gang.status, gang.status_reason) == (
        S.QUEUED,
        "waiting for 2 nodes with 1 free a100 GPU each: 1 such node free on cluster "
        + cluster.name,
    )
    slurm("scancel", foreign, conf=slurm_conf)
    admitted = wait_until(lambda: admit_queued_jobs().admitted, what="the gang's admission")
    launch_attempts(admitted)

    def ranks_running() -> list[dict]:
        reconcile_all()
        job = Job.objects.select_related("current_attempt").get(pk=gang.pk)
        return job.current_attempt.ranks if job.status == S.RUNNING else []

    ranks = wait_until(ranks_running, what="the gang running with its ranks recorded")
    assert [(r["rank"], r["state"]) for r in ranks] == [(0, "running"), (1, "running")]
    assert sorted(r["node"] for r in ranks) == list(MULTI)
    # 2 GPUs are free in all, 1 on each node (where Slurm put the gang's ranks): a 2-GPU
    # single-node job waits
    single = gang_job(team, user, f"{token}single", ["true"], nodes=1, gpus_per_node=2)
    assert admit_queued_jobs().admitted == []
    single.refresh_from_db()
    assert single.status_reason == (
        f"waiting for 1 node with 2 free a100 GPUs: 0 such nodes free on cluster {cluster.name}"
    )


# -- what capacity reads, without a cluster -----------------------------------------------------


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [("multi[1-2]", ["multi1", "multi2"]), ("gpu[01-03,07],login", ["gpu01", "gpu02", "gpu03",
     "gpu07", "login"]), ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
     ("vm", ["vm"]), ("", []), ("odd[a-b]", ["odd[a-b]"])],
)  # fmt: skip
def test_node_lists_expand_as_scontrol_show_hostnames_does(hostlist, names):
    assert expand_hostlist(hostlist) == names


@pytest.mark.parametrize(
    ("gres", "kind"),
    [("gpu:a100:2(S:0)", "a100"), ("gpu:4", ""), ("gpu:4(S:0-1)", ""), ("gpu:(null):4", ""),
     ("gpu:a100:1,gpu:v100:3", "v100"), ("gpu:b:2,gpu:a:2", "a"), ("(null)", "")],
)  # fmt: skip
def test_a_nodes_gpu_type_is_the_type_it_has_most_of(gres, kind):
    assert gpu_gres_type(gres) == kind


def test_each_node_is_less_only_the_foreign_gpus_on_it(tmp_path):
    fake = FakeSlurm()
    fake.answer(
        "sinfo",
        "a1|gpu*|mixed|gpu:a100:4(S:0-1)|gpu:a100:3(IDX:0-2)|\n"
        "a2|gpu*|mixed|gpu:a100:4(S:0-1)|gpu:a100:2(IDX:0-1)|\n"
        "m1|gpu*|idle|gpu:a100:1,gpu:v100:2|gpu:a100:0(IDX:N/A),gpu:v100:0(IDX:N/A)|\n",
    )
    # a 2-node Starforge gang with 2 GPUs on each of a1 and a2; someone else's job holds 1 on a1
    fake.answer("squeue", "gres:gpu:a100:2|sf-gang-a1|a[1-2]|\ngres/gpu:1|train|a1|\n")
    cluster = Cluster(name="slurm-parse", kind="slurm", settings={"work_dir": str(tmp_path)})
    capacity = SlurmExecutor(cluster, run=fake).capacity()
    assert capacity.nodes == (
        NodeCapacity("a1", 3, "a100"),
        NodeCapacity("a2", 4, "a100"),
        NodeCapacity("m1", 3, "v100"),
    )
    assert capacity.total_gpus == 11 - 1 and not capacity.ranks_share_nodes
