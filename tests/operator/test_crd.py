"""The committed CRD is exactly what the models generate, and it is a structural schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from unittest.mock import ANY

import pytest
import yaml

from horizonserve.operator import crd, models

from .conftest import DATA

COMMITTED = crd.default_path()


def test_committed_crd_matches_the_models() -> None:
    assert COMMITTED.exists(), "run `python -m horizonserve.operator.crd --write`"
    assert COMMITTED.read_text() == crd.render(), (
        f"{COMMITTED} drifted from operator/models.py: "
        "run `python -m horizonserve.operator.crd --write` and commit the result"
    )


def test_cel_variant_matches_the_models_and_carries_the_rules() -> None:
    path = crd.default_path(cel=True)
    assert path.read_text() == crd.render(cel=True), f"run `python -m {crd.__name__} --write`"
    schema = crd.crd(cel=True)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert any("nodeSelector" in r for r in rules) and any("startsWith('-')" in r for r in rules)
    assert spec["properties"]["control"]["x-kubernetes-validations"]
    # The shipped CRD has none: kubectl and helm refuse the keyword against a 1.20-1.24 server.
    assert "x-kubernetes-validations" not in crd.render()


def test_the_name_must_be_a_dns_1035_label() -> None:
    """The Service in front of the pods takes the OmniService's name."""
    import re

    name = crd.open_api_schema()["properties"]["metadata"]["properties"]["name"]
    assert name["maxLength"] == 63
    for good in ("payments", "qwen-omni", "a1"):
        assert re.match(name["pattern"], good)
    for bad in ("my.svc", "9lives", "-x", "x-", "Upper"):
        assert not re.match(name["pattern"], bad), bad


def test_cli_prints_and_writes(tmp_path, capsys) -> None:
    assert crd.main([]) == 0
    assert capsys.readouterr().out == crd.render()
    out = tmp_path / "crd.yaml"
    assert crd.main(["--output", str(out)]) == 0
    assert out.read_text() == crd.render()


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key in ("properties",):
            for name, child in (node.get(key) or {}).items():
                yield from _walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}.*")


def _schema() -> dict[str, Any]:
    doc = yaml.safe_load(COMMITTED.read_text())
    return doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_schema_is_structural() -> None:
    text = COMMITTED.read_text()
    assert "$ref" not in text and "$defs" not in text and "title:" not in text
    for path, node in _walk(_schema()):
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path}: no type"
        assert "anyOf" not in node and "allOf" not in node and "oneOf" not in node, path
        assert node.get("additionalProperties") is not False, path
        assert not ("properties" in node and "additionalProperties" in node), path
        assert "patternProperties" not in node and "propertyNames" not in node, path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path
        if node.get("x-kubernetes-preserve-unknown-fields"):
            # Unknown fields kept for the webhook to refuse; only on typed spec objects.
            assert path.startswith(".spec") and node.get("type") == "object", path
            assert "properties" in node, f"{path}: untyped"
        if "default" in node:
            assert not isinstance(node["default"], dict | list), path


def _leaves(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for p, n in _walk(node, path):
        if n.get("x-kubernetes-int-or-string"):  # both a string and a number
            yield p, {**n, "type": "string"}
            yield p, {**n, "type": "integer"}
        else:
            yield p, n


def test_every_spec_value_is_bounded_at_apply() -> None:
    """maxLength on every string (or an enum), a maximum on every number, maxItems on every
    list and maxProperties on every map: no spec can grow past what the webhook accepts."""
    unbounded = []
    for path, node in _leaves(_schema()["properties"]["spec"], ".spec"):
        kind = node.get("type")
        if kind == "string" and "enum" not in node and "maxLength" not in node:
            unbounded.append(f"{path}: string without maxLength")
        elif kind in ("integer", "number") and "enum" not in node and "maximum" not in node:
            unbounded.append(f"{path}: {kind} without maximum")
        elif kind == "array" and "maxItems" not in node:
            unbounded.append(f"{path}: array without maxItems")
        elif kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
            unbounded.append(f"{path}: map without maxProperties")
    assert not unbounded, "\n".join(unbounded)


def test_spec_objects_keep_unknown_fields_for_the_webhook() -> None:
    spec = _schema()["properties"]["spec"]
    typed = [p for p, n in _walk(spec, ".spec") if "properties" in n]
    assert typed and all(
        n.get("x-kubernetes-preserve-unknown-fields") for _, n in _walk(spec) if "properties" in n
    ), typed
    assert "x-kubernetes-preserve-unknown-fields" not in _schema()["properties"]["status"]


def test_status_fields_are_declared_and_not_defaulted() -> None:
    status = _schema()["properties"]["status"]
    declared = set(status["properties"])
    wire = {f.alias for f in models.OmniServiceStatus.model_fields.values()}
    assert declared == wire
    assert not [p for p, n in _walk(status) if "default" in n]
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert set(conditions["items"]["properties"]["type"]["enum"]) == set(models.CONDITION_TYPES)


def test_names_columns_and_subresource() -> None:
    doc = yaml.safe_load(COMMITTED.read_text())
    spec = doc["spec"]
    assert doc["metadata"]["name"] == "omniservices.horizonserve.io"
    assert spec["names"]["shortNames"] == ["osvc"] and spec["scope"] == "Namespaced"
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    for name in ("Model", "Nodes", "Attainment", "Ready", "Endpoint", "Age"):
        assert name in columns and "priority" not in columns[name]
    for name in ("Text", "Audio", "Image"):
        assert columns[name]["priority"] == 1
    assert columns["Age"]["type"] == "date"


def test_spec_schema_carries_the_model_constraints() -> None:
    spec = _schema()["properties"]["spec"]
    props = spec["properties"]
    assert spec["required"] == ["pipeline"]
    assert props["pipeline"]["enum"] == ["qwen2_5_omni", "mimo_audio", "bagel"]
    assert props["policy"]["enum"][:3] == ["horizon", "fcfs", "edf"]
    assert props["calibration"]["properties"]["mode"]["enum"] == ["auto", "skip", "force"]
    assert props["slo"]["properties"]["multiplier"]["exclusiveMinimum"] is True
    override = props["slo"]["properties"]["classOverrides"]["additionalProperties"]
    assert override == {"minimum": 0, "exclusiveMinimum": True, "maximum": 1000, "type": "number"}
    quantity = props["resources"]["properties"]["limits"]["additionalProperties"]
    assert quantity["x-kubernetes-int-or-string"] is True
    assert {"pattern", "maxLength", "maximum"} <= set(quantity)
    assert "hostPath" not in props["calibration"]["properties"]
    assert props["allGpuNodes"] == {"default": False, "type": "boolean", "description": ANY}
    assert props["image"]["maxLength"] == models.MAX_IMAGE_LENGTH and "pattern" in props["image"]
    control = props["control"]["properties"]
    assert {"uGuard", "rotationNMin", "rotationNMax", "ewmaGamma", "bSat"} <= set(control)
    assert props["ladder"]["required"] == ["levels", "aggressive", "total"]


@pytest.mark.parametrize("name", ["omniservice.yaml", "invalid-override.yaml"])
def test_test_examples_parse(name: str) -> None:
    obj = yaml.safe_load((DATA / name).read_text())
    models.OmniServiceSpec.model_validate(obj["spec"])


def test_unsupported_construct_is_an_error() -> None:
    with pytest.raises(crd.SchemaError):
        crd.structural({"anyOf": [{"type": "string"}, {"type": "boolean"}]}, {}, "x")
