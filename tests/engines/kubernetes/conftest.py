"""Fixtures for the Kubernetes executor: the API emulator, a cluster pointed at it, a fake node."""

import sys

import pytest

from jobs.executors.kubernetes import KubernetesExecutor
from jobs.models import Cluster
from tests.engines.kubernetes.apiserver import FakeApiServer
from tests.engines.kubernetes.kubelet import FakeKubelet


@pytest.fixture
def apiserver():
    with FakeApiServer() as api:
        yield api


@pytest.fixture
def k8s_settings(apiserver, tmp_path) -> dict:
    """Cluster settings reaching the emulator through a kubeconfig, as an admin would write them."""
    return {
        "kubeconfig": str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")),
        "context": "emulator",
        "namespace": "default",
        "image": "registry.example/train:v2",
        "python": sys.executable,  # the FakeKubelet runs the container's command on this host
    }


@pytest.fixture
def executor(k8s_settings) -> KubernetesExecutor:
    return KubernetesExecutor(Cluster(name="gpu-k8s", kind="kubernetes", settings=k8s_settings))


@pytest.fixture
def kubelet(apiserver, tmp_path):
    with FakeKubelet(apiserver, root=tmp_path / "node") as node:
        yield node
