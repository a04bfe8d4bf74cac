"""The chart ships the generated CRD unchanged, and the plain-YAML install carries it too."""

from __future__ import annotations

import pytest

from .chartlib import (
    CHART_CRDS,
    CRD_FILE,
    CRD_NAME,
    GENERATED_CRD,
    INSTALL_YAML,
    ROOT,
    kubernetes_validate,
    load_yaml_file,
    one,
    require_generated_crd,
)


def test_chart_crd_is_identical_to_the_generated_one() -> None:
    require_generated_crd()
    copy = CHART_CRDS / CRD_FILE
    assert copy.exists(), "run `bash charts/sync-crds.sh` to copy the CRD into the chart"
    assert copy.read_bytes() == GENERATED_CRD.read_bytes(), (
        f"{copy.relative_to(ROOT)} differs from {GENERATED_CRD.relative_to(ROOT)}: "
        "run `bash charts/sync-crds.sh`"
    )


def test_chart_ships_no_other_crd() -> None:
    generated = {p.name for p in GENERATED_CRD.parent.glob("*.yaml")}
    shipped = {p.name for p in CHART_CRDS.glob("*")}
    assert shipped == generated, "run `bash charts/sync-crds.sh`"


def test_install_yaml_carries_the_same_crd() -> None:
    crd = require_generated_crd()
    assert INSTALL_YAML.exists(), "run `bash charts/sync-crds.sh`"
    assert one(load_yaml_file(INSTALL_YAML), "CustomResourceDefinition", CRD_NAME) == crd


def test_crd_is_what_the_chart_and_examples_expect() -> None:
    crd = require_generated_crd()
    assert crd["metadata"]["name"] == CRD_NAME
    spec = crd["spec"]
    assert spec["group"] == "horizonserve.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "OmniService"
    assert "osvc" in spec["names"]["shortNames"]
    (version,) = [v for v in spec["versions"] if v["storage"]]
    assert version["name"] == "v1alpha1" and version["served"]
    assert version["subresources"]["status"] == {}  # the chart's RBAC grants omniservices/status
    columns = {c["name"] for c in version["additionalPrinterColumns"]}
    assert {"Model", "Nodes", "Attainment", "Ready", "Age"} <= columns


@pytest.mark.parametrize("k8s_version", ["1.25.0", "1.37.0"])
def test_crd_validates_strictly(k8s_version: str) -> None:
    require_generated_crd()
    res = kubernetes_validate(CHART_CRDS / CRD_FILE, k8s_version)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "passed for resource customresourcedefinition/" in res.stdout + res.stderr
