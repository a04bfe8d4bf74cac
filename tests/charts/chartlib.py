"""Paths and helpers shared by the chart tests (tests/charts: no helm; tests/helm: helm)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "horizonserve"
CHART_CRDS = CHART / "crds"
CRD_NAME = "omniservices.horizonserve.io"
CRD_FILE = "horizonserve.io_omniservices.yaml"
GENERATED_CRD = ROOT / "crds" / CRD_FILE
MANIFESTS = ROOT / "manifests"
INSTALL_YAML = MANIFESTS / "install.yaml"
EXAMPLES = MANIFESTS / "examples"
PIPELINES = ("qwen2_5_omni", "mimo_audio", "bagel")
OPERATOR_DOCKERFILE = ROOT / "operator" / "Dockerfile"
# The operator's entry point: the image's ENTRYPOINT and the chart's container command.
OPERATOR_COMMAND = ["python", "-m", "horizonserve.operator"]

# What `manifests/install.yaml` is rendered with (charts/sync-crds.sh).
DEFAULT_RELEASE = "horizonserve"
DEFAULT_NAMESPACE = "horizonserve-system"


def load_docs(text: str) -> list[dict[str, Any]]:
    """YAML documents of a multi-document stream, empty ones dropped."""
    return [d for d in yaml.safe_load_all(text) if d]


def load_yaml_file(path: Path) -> list[dict[str, Any]]:
    return load_docs(path.read_text())


def find(docs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> list[dict]:
    return [
        d for d in docs if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def require_generated_crd() -> dict[str, Any]:
    """The generated CRD (top-level crds/), or a test failure that says who writes it."""
    assert GENERATED_CRD.exists(), (
        f"{GENERATED_CRD.relative_to(ROOT)} is missing: it is generated from the operator's "
        "pydantic models (operator/), then copied into the chart by `bash charts/sync-crds.sh`"
    )
    return one(load_yaml_file(GENERATED_CRD), "CustomResourceDefinition")


# ------------------------------------------------------------------ CRD schema -> JSON Schema


def _openapi_to_jsonschema(node: Any, strict: bool) -> Any:
    """Turn a CRD's structural OpenAPI v3 schema into a JSON Schema (draft 7) for jsonschema.

    - `nullable: true` widens `type` with "null";
    - `x-kubernetes-int-or-string` becomes integer-or-string;
    - with `strict`, an object that lists `properties` but neither `additionalProperties` nor
      `x-kubernetes-preserve-unknown-fields` refuses unknown keys. The API server would prune
      them silently; in an example they are typos we want to see.
    """
    if isinstance(node, list):
        return [_openapi_to_jsonschema(n, strict) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {k: _openapi_to_jsonschema(v, strict) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = _openapi_to_jsonschema(value, strict)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [_openapi_to_jsonschema(v, strict) for v in value]
        elif key.startswith("x-kubernetes-") or key in ("nullable", "description", "example"):
            continue
        else:
            out[key] = copy.deepcopy(value)
    # OpenAPI 3.0 (boolean) exclusive bounds -> JSON Schema draft 7 (numeric) ones.
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        flag = out.get(exclusive)
        if isinstance(flag, bool):
            del out[exclusive]
            if flag and bound in out:
                out[exclusive] = out.pop(bound)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*types, "null"]
    if (
        strict
        and "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crd_version(crd: dict[str, Any], version: str | None = None) -> dict[str, Any]:
    versions = crd["spec"]["versions"]
    if version is None:
        return next(v for v in versions if v.get("storage"))
    return next(v for v in versions if v["name"] == version)


def crd_validator(crd: dict[str, Any], version: str | None = None, *, strict: bool = True):
    schema = _openapi_to_jsonschema(crd_version(crd, version)["schema"]["openAPIV3Schema"], strict)
    # apiVersion/kind/metadata are checked by the API server itself, not the CRD schema.
    for key in ("apiVersion", "kind", "metadata"):
        schema.get("properties", {}).pop(key, None)
    if "additionalProperties" in schema:
        schema["additionalProperties"] = True
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def crd_errors(crd: dict[str, Any], obj: dict[str, Any], *, strict: bool = True) -> list[str]:
    """Why `obj` does not fit the CRD (group, version, kind and schema); [] when it does."""
    errors = []
    group = crd["spec"]["group"]
    kind = crd["spec"]["names"]["kind"]
    group_version, _, version = str(obj.get("apiVersion", "")).partition("/")
    served = [v["name"] for v in crd["spec"]["versions"] if v.get("served")]
    if group_version != group or version not in served:
        errors.append(f"apiVersion {obj.get('apiVersion')!r}: expected {group}/{{{served}}}")
        return errors
    if obj.get("kind") != kind:
        errors.append(f"kind {obj.get('kind')!r}: expected {kind!r}")
    name = obj.get("metadata", {}).get("name", "")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) or len(name) > 63:
        errors.append(f"metadata.name {name!r} is not a DNS-1123 label")
    validator = crd_validator(crd, version, strict=strict)
    for err in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in err.absolute_path) or "<root>"
        errors.append(f"{path}: {err.message}")
    return errors


# ------------------------------------------------------------------ kubernetes-validate


def kubernetes_validate_bin() -> str:
    """The kubernetes-validate CLI of this interpreter's environment (dev extra)."""
    beside = Path(sys.executable).with_name("kubernetes-validate")
    if beside.exists():
        return str(beside)
    found = shutil.which("kubernetes-validate")
    assert found, "kubernetes-validate is not installed (pip install -e '.[dev]')"
    return found


def kubernetes_validate(path: Path, version: str) -> subprocess.CompletedProcess[str]:
    """`kubernetes-validate --strict -k VERSION PATH` (offline: it bundles the schemas)."""
    return subprocess.run(
        [kubernetes_validate_bin(), "--strict", "-k", version, str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
