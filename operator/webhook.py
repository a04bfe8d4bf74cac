"""The validating admission webhook: a spec the operator could not serve is refused at
`kubectl apply`, with the field and the fix, instead of being accepted and flagged later.

The CRD schema refuses what it can state (types, enums, bounds, patterns, sizes); it keeps
unknown fields (`x-kubernetes-preserve-unknown-fields`) instead of pruning them, so that this
webhook sees and refuses them. Here the whole spec goes through the same parse and
translation the reconciler uses (`controller.parse`): unknown fields, the empty node
selector, ladder order and S_cap ≤ S_aggr ≤ S_tot, class override names, rotation bounds,
requests ≤ limits; and the size of the spec, which kopf copies into its last-handled
annotation (an object whose annotations pass 256 KiB can no longer be updated, nor its
finalizer removed).

It also holds the spec to the chart's policy (`policy.py`: registries, PriorityClasses, a
model that is no flag) and the name to a DNS-1035 label (the Service takes it).

Writes that leave the spec as it was (status, kopf's own finalizer and annotations, a
deletion) always pass: an object stored before the webhook existed must stay deletable.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import kopf

from horizonserve.operator.controller import parse
from horizonserve.operator.policy import Policy, name_refusal
from horizonserve.runtime.config import load_pipeline

WEBHOOK_ID = "validate-omniservice"  # also the URL path: /validate-omniservice
# kopf's last-handled annotation holds the spec; with the other annotations the total must
# stay under the API server's 256 KiB. The schema's bounds keep a spec far smaller anyway.
MAX_SPEC_BYTES = 64 * 1024
HTTP_UNPROCESSABLE = 422


@functools.lru_cache(maxsize=8)
def _load(name: str) -> Any:
    return load_pipeline(name)


def refusal(
    spec: Mapping[str, Any], default_image: str, policy: Policy | None = None, name: str = ""
) -> str | None:
    """Why the spec is refused (field path first), or None when it is fine."""
    if name and (why := name_refusal(name)) is not None:
        return why
    size = len(json.dumps(spec, separators=(",", ":")))
    if size > MAX_SPEC_BYTES:
        return (
            f"spec: {size} bytes exceeds the {MAX_SPEC_BYTES}-byte limit of an OmniService "
            "spec; shorten the largest fields (model, image, maps)"
        )
    return parse(spec, default_image, _load, policy).error


def admit(
    body: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    subresource: str | None,
    image: str,
    policy: Policy | None = None,
) -> None:
    """Raise kopf.AdmissionError (HTTP 422) for a spec the operator cannot serve."""
    if subresource:
        return
    spec = dict(body.get("spec") or {})
    if old is not None and dict(old.get("spec") or {}) == spec:
        return  # the spec is untouched: finalizers, annotations, labels, deletion
    name = str((body.get("metadata") or {}).get("name") or "")
    reason = refusal(spec, image, policy, name if old is None else "")
    if reason is not None:
        raise kopf.AdmissionError(reason, code=HTTP_UNPROCESSABLE)
