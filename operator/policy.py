"""What creating an OmniService may ask for: no more than the chart allows.

Creating an OmniService makes the operator create pods, a Service and RBAC in its namespace
with the operator's rights, so the spec is held to what the chart's values allow
(docs/operator.md says it for people):

* `metadata.name`: a DNS-1035 label, since the Service in front of the pods takes it.
* `spec.image`: only from an allowed registry (chart value `servingPolicy.registries`,
  env HORIZONSERVE_ALLOWED_REGISTRIES; empty: the registry of the chart's own serving image).
* `spec.priorityClassName`: only from an allowlist (`servingPolicy.priorityClasses`, env
  HORIZONSERVE_ALLOWED_PRIORITY_CLASSES; empty: any class except `system-*`); a `system-*`
  class only when the list names it.
* `spec.model`: a model id or a path, never a flag (`--trust-remote-code`).
* `spec.apiKeySecret`: the Secret must carry the label `horizonserve.io/api-key: allowed`,
  set by whoever may read it (checked by the operator before it creates a pod; see
  `controller.secret_refusal`).

Pure functions: the webhook, the reconciler and the tests call them alike.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

DNS_1035_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS_1035_MAX = 63
_DNS_1035 = re.compile(DNS_1035_PATTERN)
SECRET_LABEL = "horizonserve.io/api-key"
SECRET_LABEL_VALUE = "allowed"
DEFAULT_REGISTRY = "docker.io"
SYSTEM_PRIORITY_PREFIX = "system-"


def name_refusal(name: str) -> str | None:
    """Why an OmniService name cannot be served (the Service takes the name), or None."""
    if len(name) <= DNS_1035_MAX and _DNS_1035.match(name):
        return None
    return (
        f"metadata.name: {name!r} cannot name the Service in front of the serving pods: a "
        "Service name is a DNS-1035 label (lower-case letters, digits and '-', starting with "
        f"a letter, ending with a letter or digit, at most {DNS_1035_MAX} characters); no dot, "
        "no leading digit. Rename the OmniService"
    )


def registry_of(image: str) -> str:
    """The registry host of an image reference (`docker.io` when it names none)."""
    first, sep, _rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return DEFAULT_REGISTRY


def model_refusal(model: str | None) -> str | None:
    if model is not None and model.startswith("-"):
        return (
            f"spec.model: {model!r} starts with '-': a model is a model id or a path, never a "
            "command-line flag; name the model (e.g. Qwen/Qwen2.5-Omni-7B) or its path"
        )
    return None


@dataclasses.dataclass(frozen=True)
class Policy:
    """The chart's limits on a spec (see the module docstring)."""

    registries: tuple[str, ...] = ()  # empty: the default image's registry only
    priority_classes: tuple[str, ...] = ()  # empty: any class but system-*

    def allowed_registries(self, default_image: str) -> tuple[str, ...]:
        return self.registries or (registry_of(default_image),)

    def refusal(
        self,
        *,
        image: str | None,
        default_image: str,
        priority_class: str | None,
        model: str | None,
    ) -> str | None:
        """Why the spec asks for more than the chart allows (field first), or None."""
        if image is not None:
            allowed = self.allowed_registries(default_image)
            registry = registry_of(image)
            if registry not in allowed:
                return (
                    f"spec.image: registry {registry!r} is not allowed here (allowed: "
                    f"{', '.join(allowed)}); use an image from an allowed registry, or ask the "
                    "cluster admin to add it to the chart value servingPolicy.registries"
                )
        if priority_class is not None:
            refusal = self._priority_refusal(priority_class)
            if refusal is not None:
                return refusal
        return model_refusal(model)

    def _priority_refusal(self, name: str) -> str | None:
        if self.priority_classes:
            if name in self.priority_classes:
                return None
            listed = ", ".join(self.priority_classes)
            return (
                f"spec.priorityClassName: {name!r} is not allowed here (allowed: {listed}); "
                "the chart value servingPolicy.priorityClasses lists them"
            )
        if name.startswith(SYSTEM_PRIORITY_PREFIX):
            return (
                f"spec.priorityClassName: {name!r} is a system class (reserved for cluster "
                "components, it may preempt them); it is allowed only when the chart value "
                "servingPolicy.priorityClasses names it"
            )
        return None


def split_list(raw: str | None) -> tuple[str, ...]:
    """`a, b,c` → ('a', 'b', 'c') (env values)."""
    return tuple(p.strip() for p in (raw or "").split(",") if p.strip())


def secret_labelled(labels: Mapping[str, str] | None) -> bool:
    return (labels or {}).get(SECRET_LABEL) == SECRET_LABEL_VALUE


def secret_refusal_message(name: str, found: bool) -> str:
    if not found:
        return f"spec.apiKeySecret.name: Secret {name!r} does not exist in this namespace"
    return (
        f"spec.apiKeySecret.name: Secret {name!r} does not carry the label "
        f"{SECRET_LABEL}={SECRET_LABEL_VALUE}; whoever may read the Secret allows its use by "
        f"an OmniService with `kubectl label secret {name} {SECRET_LABEL}={SECRET_LABEL_VALUE}`"
    )


def join(*reasons: str | None) -> str | None:
    """The first reason that is not None."""
    return next((r for r in reasons if r is not None), None)
