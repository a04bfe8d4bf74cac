"""helm helpers for the chart tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from ..charts.chartlib import CHART, DEFAULT_NAMESPACE, DEFAULT_RELEASE, load_docs

HERE = Path(__file__).resolve().parent
GET_HELM = HERE / "get-helm.sh"
HELM_VERSION = "v3.17.2"


def helm(helm_bin: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        [helm_bin, *args], capture_output=True, text=True, check=False, timeout=120
    )
    if check and res.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({res.returncode}):\n{res.stderr}")
    return res


def set_args(values: dict[str, Any] | None) -> list[str]:
    """`--set-json key=value` for each override (keeps types: bools, ints, lists, maps)."""
    out: list[str] = []
    for key, value in (values or {}).items():
        out += ["--set-json", f"{key}={json.dumps(value)}"]
    return out


def template_text(
    helm_bin: str,
    values: dict[str, Any] | None = None,
    *,
    release: str = DEFAULT_RELEASE,
    namespace: str = DEFAULT_NAMESPACE,
    include_crds: bool = False,
    extra: tuple[str, ...] = (),
) -> str:
    args = ["template", release, str(CHART), "--namespace", namespace, *set_args(values)]
    if include_crds:
        args.append("--include-crds")
    return helm(helm_bin, *args, *extra).stdout


def template(helm_bin: str, values: dict[str, Any] | None = None, **kw: Any) -> list[dict]:
    return load_docs(template_text(helm_bin, values, **kw))


def rule_map(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """RBAC rules as (apiGroup, resource) → verbs (no resourceNames or URLs expected)."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out
