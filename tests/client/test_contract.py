"""The runner contract (`sf.contract`) has one owner: the runner and every counterpart (the
executors, the scheduler's names) use its values and agree on what they mean, and `read_json`
refuses whatever a job could leave in an attempt dir instead of a record."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sf import contract, environment, runner

from jobs.executors import base, local, ray, slurm
from jobs.executors.base import LaunchSpec, record_key
from jobs.executors.kubernetes import observe as kubernetes_observe
from jobs.executors.slurm import executor as slurm_executor
from jobs.executors.slurm import parse as slurm_parse
from jobs.loops import scheduler
from jobs.models import Cluster
from tests.structure.constants import constants

ROOT = Path(__file__).resolve().parents[2]
NAME = "sf-contract-a1"


# -- one owner -------------------------------------------------------------------------------


def test_the_runner_and_the_server_sign_and_refuse_with_the_contracts_own_functions():
    assert runner.INGEST_EXIT is contract.INGEST_EXIT == 86
    assert runner.record_mac is contract.record_mac is base.record_mac
    assert base.read_json is contract.read_json and local.read_json is contract.read_json
    assert base.RUNNER_SECRETS is contract.RUNNER_SECRETS <= environment.RUNNER_ONLY


def test_every_executor_reads_the_runners_exit_codes_from_the_contract():
    for module in (slurm_executor, ray, kubernetes_observe):
        assert module.INGEST_EXIT is contract.INGEST_EXIT
    for module in (slurm_parse, ray, kubernetes_observe):
        assert module.entrypoint_code is contract.entrypoint_code
    assert local.INGEST_FAILED is slurm_executor.INGEST_FAILED is contract.INGEST_FAILED


def contract_values() -> set[object]:
    """The values only the contract may spell out: the ingest exit code and words, the file
    and variable names. (The prefix "sf-" and 128 or 64 are too common to look for: the tests
    above and below check their use.)"""
    files = ["EXIT_FILE", "STARTED_FILE", "PROC_FILE", "CONSOLE_LOG", "METRICS_FILE"]
    names = ["INGEST_EXIT", "INGEST_FAILED", "LIVENESS_LOCK", "PARENT_PREFIX", *files]
    names += [n for n in dir(contract) if n.endswith("_VAR")]
    return {getattr(contract, n) for n in names}


def literals(path: Path) -> set[object]:
    """The constants a module's code holds, docstrings left out."""
    return constants(path.read_text())


# The runner's side, the executors, and the server's other readers and writers of SF_* names.
PARTIES = sorted(
    [
        *(ROOT / "client" / "sf").rglob("*.py"),
        *(ROOT / "jobs" / "executors").rglob("*.py"),
        ROOT / "jobs" / "loops" / "launcher.py",
        ROOT / "jobs" / "api" / "ingest.py",
    ]
)
# The SF_* names a party may spell itself: settings of its own that no other party reads.
OWN_NAMES = {
    "SF_CONFIG",  # sf.config: the CLI's config file, server and token
    "SF_URL",
    "SF_TOKEN",
    "SF_MAX_SNAPSHOT_MB",  # sf submit: the snapshot's size cap
    "SF_ENV_KEEP",  # the Ray executor's entrypoint wrapper, set and read by jobs.executors.ray
}


@pytest.mark.parametrize("path", PARTIES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_party_writes_a_contract_value_down_again(path):
    if path.name == "contract.py":
        return
    copied = literals(path) & contract_values()
    assert copied == set(), f"{path.name} spells out {sorted(map(str, copied))}: use sf.contract"


@pytest.mark.parametrize("path", PARTIES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_sf_name_a_party_spells_is_the_contracts_or_its_own(path):
    if path.name == "contract.py":
        return
    spelled = {v for v in literals(path) if isinstance(v, str) and re.fullmatch(r"SF_\w*", v)}
    assert spelled <= OWN_NAMES, f"{path.name} spells out {sorted(spelled - OWN_NAMES)}"


def test_the_contract_names_each_sf_variable_once():
    names = [n for n in dir(contract) if n.endswith("_VAR") or n == "PARENT_PREFIX"]
    values = [getattr(contract, n) for n in names]
    # MLflow's client and TensorBoard's users have names of their own: the contract's only
    # variables not of ours.
    theirs = {
        contract.TRACKING_URI_VAR,
        contract.TRACKING_TOKEN_VAR,
        contract.TENSORBOARD_LOGDIR_VAR,
    }
    assert all(v.startswith("SF_") for v in values if v not in theirs)
    assert len(set(values)) == len(values), "two names for one variable"
    assert not set(values) & OWN_NAMES


def test_the_scheduler_names_backend_objects_as_the_contract_does():
    assert contract.backend_name("r1x", 3) == "sf-r1x-a3"
    assert scheduler.backend_name is contract.backend_name  # the scheduler names attempts so
    assert contract.backend_name("r1x", 3).startswith(contract.BACKEND_PREFIX)


# -- exit codes ------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 3, 127, 128, -1, -9, -15, -64])
def test_the_runners_exit_status_maps_back_to_the_entrypoints_code(code):
    status = contract.exit_status(code)
    assert 0 <= status <= 255 and contract.entrypoint_code(status) == code
    assert contract.killed_by(status) == (-code if code < 0 else None)


def test_every_executor_reads_ingest_and_signals_from_the_runners_exit_status():
    killed = contract.exit_status(-9)
    # Slurm: the batch step's wait status
    assert slurm_parse.exit_code_of(contract.INGEST_EXIT << 8) == contract.INGEST_EXIT
    assert slurm_parse.exit_code_of(killed << 8) == -9
    # Kubernetes: the container's exit code
    ingest = kubernetes_observe._exited({"exitCode": contract.INGEST_EXIT, "message": ""}, {})
    assert (ingest.native_state, ingest.failure) == ("Failed/IngestFailed", "ingest")
    assert ingest.message.startswith(contract.INGEST_FAILED)
    assert f"(exit {contract.INGEST_EXIT})" in ingest.message
    signalled = kubernetes_observe._exited({"exitCode": killed, "reason": "Error"}, {})
    assert (signalled.native_state, signalled.exit_code) == ("Failed/Killed", -9)
    # Ray: the driver's exit code
    failed = {"status": "FAILED", "message": "boom"}
    assert ray.observe({**failed, "driver_exit_code": contract.INGEST_EXIT}).failure == "ingest"
    assert ray.observe({**failed, "driver_exit_code": killed}).exit_code == -9


def test_the_runners_ingest_failure_is_what_the_executors_call_one(tmp_path):
    env = environment.RunnerEnv(contract.file_env(tmp_path))
    assert runner._ingest_failed(env, "no snapshot") == contract.INGEST_EXIT
    record = contract.read_json(tmp_path / contract.EXIT_FILE)
    assert record["reason"] == f"{contract.INGEST_FAILED}: no snapshot"
    assert local._exited(record, None).native_state == "INGEST_FAILED"


# -- files -----------------------------------------------------------------------------------


def test_the_runner_keeps_its_files_where_the_executors_say(tmp_path):
    env = environment.RunnerEnv(contract.file_env(tmp_path, proc_file=True))
    assert env.exit_file == str(tmp_path / contract.EXIT_FILE)
    assert env.started_file == str(tmp_path / contract.STARTED_FILE)
    assert env.run_dir == str(tmp_path / contract.RUN_DIR)
    assert env.metrics_file == str(tmp_path / contract.METRICS_FILE)
    defaults = environment.RunnerEnv({})  # without the variables: the same names in its cwd
    assert Path(defaults.exit_file).name == contract.EXIT_FILE
    assert Path(defaults.run_dir).name == contract.RUN_DIR


def spec() -> LaunchSpec:
    return LaunchSpec(NAME, 1, "contract", 1, 0, ["true"], {"SF_USER_ENV": "{}"})


def test_the_local_and_slurm_executors_put_the_runners_files_in_the_attempt_dir(tmp_path):
    files = contract.file_env(tmp_path / NAME, proc_file=True)
    env = local.runner_env(spec(), tmp_path / NAME, None, sys.executable)
    assert {k: env[k] for k in files} == files
    assert env[contract.RECORD_KEY_VAR] == record_key(NAME)
    executor = slurm.SlurmExecutor(Cluster(name="hpc", kind="slurm"))
    job_env = executor._job_env(spec(), tmp_path / NAME)
    files.pop(contract.PROC_FILE_VAR)  # Slurm signals the job itself, never the runner's pid
    assert {k: job_env[k] for k in files} == files


def test_a_record_the_runner_signs_is_one_the_server_accepts(tmp_path):
    path = tmp_path / contract.EXIT_FILE
    record = {"exit_code": 0, "reason": "", "started_at": 1.5, "ended_at": 2.5}
    runner.write_record(str(path), record, record_key(NAME))
    assert base.read_record(path, NAME) == {**record, "mac": json.loads(path.read_text())["mac"]}
    assert base.read_record(path, "sf-other-a1") == {}


def test_the_slurm_executor_finds_its_own_jobs_by_the_contracts_prefix(tmp_path):
    ours, theirs = contract.backend_name("mine", 1), "train-mine"
    lines = "".join(
        f"{i}|RUNNING|None|1700000000|0|0|node1|{name}|\n" for i, name in ((1, ours), (2, theirs))
    )

    def run(command, env, fds):
        return subprocess.CompletedProcess(command, 0, lines, "")

    executor = slurm.SlurmExecutor(Cluster(name="hpc", kind="slurm"), run=run)
    assert {ref: obs.name for ref, obs in executor.starforge_objects().items()} == {"1": ours}


# -- read_json -------------------------------------------------------------------------------


def write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def test_read_json_reads_an_object(tmp_path):
    assert contract.read_json(write(tmp_path / "r.json", '{"pid": 7}')) == {"pid": 7}
    assert contract.read_json(str(tmp_path / "r.json")) == {"pid": 7}


@pytest.mark.parametrize(
    "data",
    [
        "",
        "{",
        "not json",
        "[1, 2]",
        "7",
        '"a string"',
        "null",
        '{"at": NaN}',
        '{"at": Infinity}',
        '{"at": -Infinity}',
        b'{"reason": "\xff\xfe"}',  # not UTF-8
        "[" * 100_000 + "]" * 100_000,  # nesting too deep to parse
    ],
    ids=lambda data: repr(data)[:24],
)
def test_read_json_refuses_what_is_not_one_json_object(tmp_path, data):
    assert contract.read_json(write(tmp_path / "r.json", data)) == {}


def test_read_json_refuses_a_missing_file_a_directory_and_a_bad_path(tmp_path):
    assert contract.read_json(tmp_path / "missing.json") == {}
    assert contract.read_json(tmp_path) == {}
    assert contract.read_json(str(tmp_path / "a\0b")) == {}


def test_read_json_refuses_a_symlink_even_to_a_good_record(tmp_path):
    good = write(tmp_path / "good.json", '{"pid": 7}')
    (tmp_path / "link.json").symlink_to(good)
    assert contract.read_json(tmp_path / "link.json") == {}


def test_read_json_refuses_a_fifo_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "exit.json")
    answers = []
    reader = threading.Thread(
        target=lambda: answers.append(contract.read_json(tmp_path / "exit.json"))
    )
    reader.start()
    reader.join(5)
    if reader.is_alive():  # unblock it before failing: open the FIFO for writing once
        os.close(os.open(tmp_path / "exit.json", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("read_json blocked on a FIFO")
    assert answers == [{}]


def test_read_json_refuses_a_file_larger_than_a_record(tmp_path):
    body = '{"reason": "%s"}'
    fits = body % ("x" * (contract.MAX_RECORD_BYTES - len(body % "")))
    assert len(fits) == contract.MAX_RECORD_BYTES
    assert contract.read_json(write(tmp_path / "r.json", fits))["reason"].startswith("x")
    too_big = body % ("x" * (contract.MAX_RECORD_BYTES + 1 - len(body % "")))
    assert contract.read_json(write(tmp_path / "r.json", too_big)) == {}


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_read_json_refuses_an_unreadable_file(tmp_path):
    path = write(tmp_path / "r.json", '{"pid": 7}')
    path.chmod(0)
    assert contract.read_json(path) == {}


def test_contract_imports_nothing_but_the_standard_library():
    tree = ast.parse((ROOT / "client" / "sf" / "contract.py").read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}
