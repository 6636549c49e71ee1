"""Fixtures for the Kubernetes executor: the API emulator, a cluster pointed at it, a fake node,
and three GPU nodes of two products played by one fake kubelet."""

import sys

import pytest

from jobs.executors.kubernetes import KubernetesExecutor
from jobs.models import Cluster
from tests.engines.kubernetes.apiserver import FakeApiServer
from tests.engines.kubernetes.kubelet import FakeKubelet
from tests.engines.kubernetes.objects import A100, H100, node


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


# The GPU nodes of `gpu_nodes`: name, GPUs, product.
GPU_NODES = (("a100-1", 4, A100), ("a100-2", 4, A100), ("h100-1", 8, H100))


@pytest.fixture
def gpu_nodes(apiserver, tmp_path):
    """Two nodes of 4 A100s and one of 8 H100s, as Node objects, played by one kubelet."""
    for name, gpus, product in GPU_NODES:
        apiserver.add("nodes", node(name, gpus, product=product))
    names = [name for name, _, _ in GPU_NODES]
    with FakeKubelet(apiserver, nodes=names, root=tmp_path / "nodes") as kubelet:
        yield kubelet
