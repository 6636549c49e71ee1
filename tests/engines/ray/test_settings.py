"""A ray cluster's settings are checked when the cluster is saved; bad ones say why."""

import os
import shlex
import sys

import pytest

from jobs.executors import LaunchError, LaunchSpec
from jobs.executors.base import DEFAULT_PATH, base_env, validate_cluster_settings
from jobs.executors.ray import EXEC_CLEAN, RAY_PROVIDED, RayExecutor
from jobs.models import Cluster

pytestmark = pytest.mark.ray


@pytest.mark.parametrize(
    "given, words",
    [
        ({}, "address is required: the URL of the Ray dashboard"),
        ({"address": "127.0.0.1:8265"}, "address must be the http(s) URL of the Ray dashboard"),
        ({"address": "ray://head:10001"}, "address must be the http(s) URL of the Ray dashboard"),
        ({"address": "http://h:8265", "adress": "x"}, "unknown setting(s) adress"),
        ({"address": "http://h:8265", "python": ""}, "python must be a non-empty string"),
        ({"address": "http://h:8265", "work_dir": "ray/work"}, "work_dir must be an absolute"),
        ({"address": "http://h:8265", "timeout_s": 0}, "timeout_s must be a positive number"),
        ({"address": "http://h:8265", "timeout_s": True}, "timeout_s must be a positive number"),
        ({"address": "http://h:8265", "node_env": "LD_LIBRARY_PATH"}, "node_env must be a list"),
        ({"address": "http://h:8265", "node_env": ["A B"]}, "node_env must be a list"),
    ],
)
def test_bad_settings_are_refused_with_a_sentence(given, words):
    with pytest.raises(ValueError) as refused:
        validate_cluster_settings("ray", given)
    assert words in str(refused.value)


def test_defaults_come_from_the_server_settings(settings):
    settings.SF_RUNNER_PYTHON = ""
    settings.SF_VAR_DIR = "/srv/starforge"
    executor = RayExecutor(Cluster(name="gpu-farm", kind="ray", settings={"address": "http://h/"}))
    assert (executor.address, executor.python, executor.timeout_s) == (
        "http://h",
        sys.executable,
        10,
    )
    assert str(executor.work_dir) == "/srv/starforge/ray/gpu-farm"
    body = executor._job_request(
        _spec(name="sf-abc-a2", total_gpus=2, env={"SF_RUN_ID": "abc", "WANDB_MODE": "offline"})
    )
    assert body["entrypoint"] == (
        "mkdir -p /srv/starforge/ray/gpu-farm/sf-abc-a2 && cd /srv/starforge/ray/gpu-farm/sf-abc-a2"
        f" && exec {sys.executable} -c {shlex.quote(EXEC_CLEAN)}"
    )
    run_dir = "/srv/starforge/ray/gpu-farm/sf-abc-a2/work"
    env = {
        **base_env(run_dir, path=f"{os.path.dirname(sys.executable)}:{DEFAULT_PATH}"),
        "SF_RUN_DIR": run_dir,
        "SF_RUN_ID": "abc",
        "WANDB_MODE": "offline",
    }
    keep = sorted(set(env) | RAY_PROVIDED)
    assert body["runtime_env"] == {"env_vars": {**env, "SF_ENV_KEEP": ",".join(keep)}}
    assert (body["submission_id"], body["entrypoint_num_gpus"]) == ("sf-abc-a2", 2)


def test_paths_are_quoted_for_the_shell():
    cluster = Cluster(
        name="c",
        kind="ray",
        settings={
            "address": "http://h",
            "python": "/opt/my env/python",
            "work_dir": "/w; rm -rf /",
        },
    )
    entrypoint = RayExecutor(cluster)._job_request(_spec(name="sf-x-a1"))["entrypoint"]
    assert entrypoint == (
        "mkdir -p '/w; rm -rf /sf-x-a1' && cd '/w; rm -rf /sf-x-a1' && "
        f"exec '/opt/my env/python' -c {shlex.quote(EXEC_CLEAN)}"
    )


def test_an_executor_over_bad_settings_refuses_launches_for_good():
    with pytest.raises(LaunchError) as refused:
        RayExecutor(Cluster(name="c", kind="ray", settings={"address": "head:8265"}))
    assert refused.value.permanent and str(refused.value).startswith("cluster c: address must")


def _spec(name: str, total_gpus: int = 0, env: dict | None = None) -> LaunchSpec:
    return LaunchSpec(
        name=name,
        job_id=1,
        run_id="abc",
        attempt=2,
        total_gpus=total_gpus,
        entrypoint=[],
        env=env or {},
    )
