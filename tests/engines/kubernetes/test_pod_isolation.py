"""Trust boundaries of the Kubernetes executor's pods, against the API emulator (issue 12)."""

import pytest

from jobs.executors.base import GPU_VISIBILITY_VARS
from jobs.executors.kubernetes import KubernetesExecutor
from jobs.executors.kubernetes.manifests import pod_spec
from jobs.models import Cluster
from tests.engines.kubernetes.objects import launch

pytestmark = pytest.mark.kubernetes
PLANTED = {"DATABASE_URL": "postgres://leak", "SF_SECRET_KEY": "leak"}


def pod_of(apiserver, ref: str) -> dict:
    return apiserver.get("jobs", ref)["spec"]["template"]["spec"]


def env_of(pod: dict) -> dict[str, str]:
    (container,) = pod["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def with_env(spec, **env):
    return type(spec)(**{**spec.__dict__, "env": {**spec.env, **env}})


def test_the_pod_env_is_the_base_and_the_jobs_own_and_nothing_of_the_servers(
    executor, apiserver, monkeypatch
):
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)
    spec = with_env(launch(total_gpus=1), OWN_VAR="mine")
    env = env_of(pod_of(apiserver, executor.submit(spec)))
    own = {k: v for k, v in spec.env.items() if k not in ("SF_JOB_TOKEN", "SF_RECORD_KEY")}
    assert env == {"HOME": "/sf", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", **own}
    assert not PLANTED.keys() & env.keys()
    assert "PATH" not in env  # the image's own PATH finds the image's interpreter


def test_no_job_token_or_record_key_in_the_pod_spec(executor, apiserver):
    assert KubernetesExecutor.BOOTSTRAP_TOKEN is True
    spec = with_env(
        launch(), SF_JOB_TOKEN="job-secret", SF_RECORD_KEY="key-secret", SF_BOOTSTRAP_TOKEN="once"
    )
    job = apiserver.get("jobs", executor.submit(spec))
    assert "job-secret" not in repr(job) and "key-secret" not in repr(job)
    assert env_of(job["spec"]["template"]["spec"])["SF_BOOTSTRAP_TOKEN"] == "once"


@pytest.mark.parametrize("gpus", [0, 2])
def test_a_job_cannot_choose_which_gpus_it_sees(executor, apiserver, gpus):
    spec = with_env(launch(total_gpus=gpus), **dict.fromkeys(GPU_VISIBILITY_VARS, "all"))
    env = env_of(pod_of(apiserver, executor.submit(spec)))
    if gpus == 0:  # always void, whatever the job asked for
        assert {k: env[k] for k in GPU_VISIBILITY_VARS if k in env} == {
            "NVIDIA_VISIBLE_DEVICES": "void"
        }
    else:  # the device plugin sets them from the GPUs it allocated
        assert not GPU_VISIBILITY_VARS & env.keys()


def test_pods_mount_no_service_account_token_unless_asked(apiserver, k8s_settings):
    def pod_with(run_id: str, **settings):
        cluster = Cluster(name="k", kind="kubernetes", settings={**k8s_settings, **settings})
        return pod_of(apiserver, KubernetesExecutor(cluster).submit(launch(run_id=run_id)))

    assert pod_with("plain")["automountServiceAccountToken"] is False
    named = pod_with("named", service_account="trainer")
    assert (named["serviceAccountName"], named["automountServiceAccountToken"]) == (
        "trainer",
        False,
    )


def test_mounting_the_token_needs_a_named_service_account(k8s_settings):
    with pytest.raises(ValueError, match="needs 'service_account'"):
        KubernetesExecutor.validate_settings(
            {**k8s_settings, "automount_service_account_token": True}
        )
    with pytest.raises(ValueError, match="must be true or false"):
        KubernetesExecutor.validate_settings(
            {**k8s_settings, "service_account": "t", "automount_service_account_token": "yes"}
        )
    settings = {**k8s_settings, "service_account": "t", "automount_service_account_token": True}
    KubernetesExecutor.validate_settings(settings)
    spec = KubernetesExecutor(Cluster(name="k", kind="kubernetes", settings=settings))
    assert pod_spec(spec.settings, launch())["automountServiceAccountToken"] is True
