"""Shared fixtures. ``kube_cluster``: a real Kubernetes 1.20 control plane (see tests/k8s)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import pytest

from tests.k8s.cluster import KubeCluster, find_binaries

SKIP_K8S_REASON = "HORIZONSERVE_SKIP_K8S=1: real Kubernetes control-plane tests disabled"


def _skip_k8s() -> bool:
    return os.environ.get("HORIZONSERVE_SKIP_K8S") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "kube_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.k8s)
        if _skip_k8s() and item.get_closest_marker("k8s"):
            item.add_marker(pytest.mark.skip(reason=SKIP_K8S_REASON))


@pytest.fixture(scope="session")
def kube_cluster(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeCluster]:
    """etcd + kube-apiserver + kube-controller-manager for the whole session.

    Builds the binaries with tests/k8s/build-kube.sh first when they are not cached (~10 min,
    output shown live); a failed build or start is an error, never a skip.
    """
    if _skip_k8s():
        pytest.skip(SKIP_K8S_REASON)
    capman = pytestconfig.pluginmanager.getplugin("capturemanager")

    def live() -> contextlib.AbstractContextManager[None]:  # show output despite capturing
        return capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()

    with live():
        bin_dir = find_binaries(build=True)
    cluster = KubeCluster(bin_dir, workdir=tmp_path_factory.mktemp("kube-cluster"))
    cluster.start()
    with live():
        print(
            f"\n[kube] control plane up in {cluster.startup_seconds:.1f}s at {cluster.server} "
            f"(KUBECONFIG={cluster.kubeconfig})",
            file=sys.stderr,
            flush=True,
        )
    try:
        yield cluster
    finally:
        cluster.stop()
