"""values.yaml against values.schema.json, without helm: the schema is valid JSON Schema
(draft 7, what helm 3 evaluates), the shipped values satisfy it, every key is documented and
typed, and bad values are refused."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import jsonschema
import pytest
import yaml

from .chartlib import CHART

SCHEMA_FILE = CHART / "values.schema.json"
VALUES_FILE = CHART / "values.yaml"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text())


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    return yaml.safe_load(VALUES_FILE.read_text())


def errors(schema: dict[str, Any], values: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in validator.iter_errors(values)
    ]


def test_schema_is_valid_draft7(schema: dict[str, Any]) -> None:
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    assert schema["additionalProperties"] is False


def test_default_values_validate(schema: dict[str, Any], values: dict[str, Any]) -> None:
    assert errors(schema, values) == []


def _paths(node: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            out.append((*prefix, key))
            out += _paths(value, (*prefix, key))
    return out


def _schema_node(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    node: dict[str, Any] | None = schema
    for key in path:
        if node is None:
            return None
        props = node.get("properties", {})
        if key in props:
            node = props[key]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return None
    return node


def test_every_value_is_typed_in_the_schema(schema: dict[str, Any], values: dict) -> None:
    untyped = [".".join(p) for p in _paths(values) if _schema_node(schema, p) is None]
    assert untyped == [], f"values.yaml keys missing from values.schema.json: {untyped}"
    for key, node in schema["properties"].items():
        assert node.get("description"), f"values.schema.json: {key} has no description"


def test_every_value_is_commented_in_values_yaml() -> None:
    """Each key has a comment right above it, or sits inside a block documented as a whole
    (a `# --` comment on the block's own key, e.g. securityContext)."""
    key_re = re.compile(r"^(\s*)([A-Za-z][\w./-]*):")
    stack: list[tuple[int, bool]] = []  # (indent, documented-as-a-whole) of open ancestors
    missing = []
    block: list[str] = []  # the comment lines right above the current line
    for line in VALUES_FILE.read_text().splitlines():
        m = key_re.match(line)
        if m:
            indent = len(m.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            whole = bool(block) and block[0].startswith("# --")
            if not block and not any(doc for _, doc in stack):
                missing.append(m.group(2))
            stack.append((indent, whole))
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped)
        elif stripped:
            block = []
    assert missing == [], f"values.yaml keys without a comment: {missing}"


def _override(values: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(values)
    node = out
    *parents, last = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


@pytest.mark.parametrize(
    ("dotted", "value"),
    [
        ("replicaCount", 2),
        ("image.pullPolicy", "Sometimes"),
        ("image.repository", ""),
        ("operator.logLevel", "verbose"),
        ("operator.watchNamespace", "-bad-"),
        ("operator.extraEnv", [{"name": "HORIZONSERVE_LOG_LEVEL", "value": "DEBUG"}]),
        ("securityContext.privileged", True),
        ("securityContext.capabilities", {"drop": []}),
        ("podSecurityContext.runAsNonRoot", False),
        ("podSecurityContext.seccompProfile", {"type": "Unconfined"}),
        ("resources", {"requests": {"cpu": "100m"}}),
        ("serviceAccount", {"create": False, "name": ""}),
        ("metrics.portName", "this-name-is-far-too-long"),
        ("metrics.path", "metrics"),
        ("metrics.serviceMonitor.scrapeTimeout", "ten seconds"),
    ],
)
def test_bad_values_are_refused(
    schema: dict[str, Any], values: dict[str, Any], dotted: str, value: Any
) -> None:
    assert errors(schema, _override(values, dotted, value)), f"{dotted}={value!r} was accepted"


@pytest.mark.parametrize(
    ("dotted", "value"),
    [
        ("operator.watchNamespace", "team-a"),
        ("operator.extraEnv", [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]),
        ("serviceAccount", {"create": False, "name": "existing"}),
        ("securityContext.readOnlyRootFilesystem", False),
        ("podSecurityContext.seccompProfile", {"type": "Localhost", "localhostProfile": "x"}),
        ("metrics.podMonitor.scrapeTimeout", "10s"),
        ("image.repository", "registry.local:5000/team/horizonserve-operator"),
    ],
)
def test_good_values_are_accepted(
    schema: dict[str, Any], values: dict[str, Any], dotted: str, value: Any
) -> None:
    assert errors(schema, _override(values, dotted, value)) == []
