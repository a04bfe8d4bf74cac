"""charts/upgrade-crds.sh refuses a CRD whose schema the stored OmniServices fail, listing
them with the API server's reasons (a server-side dry run), and applies nothing then."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from horizonserve.operator import crd
from tests.k8s.cluster import KubeCluster, wait_for
from tests.operator.k8s_helpers import OSVC_PATH, install_crd, new_namespace

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "charts" / "upgrade-crds.sh"
CRD_NAME = "omniservices.horizonserve.io"


def _run(cluster: KubeCluster, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *map(str, files)],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _shm_max_length(cluster: KubeCluster) -> Any:
    _, body = cluster.request(
        "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"
    )
    schema = body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]["properties"]["shmSize"]["maxLength"]


def test_stricter_crd_is_refused_while_stored_objects_fail_it(
    kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    cluster = kube_cluster
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"
    had_crd = cluster.request("GET", path)[0] == 200
    install_crd(cluster)
    ns = new_namespace(cluster, "upg")
    spec = {"pipeline": "bagel", "allGpuNodes": True, "shmSize": "16Gi"}
    obj = {"apiVersion": "horizonserve.io/v1alpha1", "kind": "OmniService",
           "metadata": {"name": "loose"}, "spec": spec}  # fmt: skip
    status, body = cluster.request("POST", OSVC_PATH.format(ns=ns), obj)
    assert status == 201, body
    # A "new" CRD whose schema allows at most 3 characters of shmSize (the default "8Gi"
    # fits): the stored object ("16Gi") fails it.
    stricter = crd.crd()
    schema = stricter["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    schema["properties"]["shmSize"]["maxLength"] = 3
    new = tmp_path / "stricter.yaml"
    new.write_text(yaml.safe_dump(stricter))
    before = _shm_max_length(cluster)
    try:
        res = _run(cluster, new)
        assert res.returncode != 0, res.stderr
        assert f"{ns}/loose:" in res.stderr and "spec.shmSize" in res.stderr, res.stderr
        assert "nothing applied" in res.stderr
        assert _shm_max_length(cluster) == before  # the CRD was left as it was
        # The shipped CRD accepts the stored object: checked, then applied.
        res = _run(cluster, crd.default_path())
        assert res.returncode == 0, res.stderr
        assert "stored OmniService(s) valid under the new schema" in res.stderr
        assert f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME} established" in (
            res.stderr
        )

        def check_crd_gone() -> bool:
            code, _ = cluster.request(
                "GET",
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                "omniservices.upgrade-check.horizonserve.io",
            )
            return code == 404

        wait_for("the throw-away check CRD removed", check_crd_gone, timeout=30)
    finally:
        cluster.request("DELETE", f"/api/v1/namespaces/{ns}")
        if not had_crd:  # leave the session cluster as it was (the plain-install test checks)
            cluster.kubectl("delete", "crd", CRD_NAME, "--wait=true", "--timeout=180s", check=False)


def test_a_timeout_that_is_not_whole_seconds_is_refused_before_anything_runs() -> None:
    res = subprocess.run(
        ["bash", str(SCRIPT)],
        env={"PATH": "/usr/bin:/bin", "TIMEOUT": "2m", "KUBECTL": "true"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert res.returncode == 1
    assert "TIMEOUT must be whole seconds, e.g. 60s (got '2m')" in res.stderr
