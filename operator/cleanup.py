"""Namespaced mode: release OmniServices outside the watched namespace.

An operator that ran cluster-wide left its finalizer (`settings.FINALIZER`) on OmniServices in
every namespace. Once it serves one namespace only, nobody would remove the finalizer
elsewhere, and deleting those OmniServices would hang. At start, the namespaced operator lists
OmniServices cluster-wide (a `list` the chart grants for this) and removes only its finalizer
from the ones outside its namespace, with a JSON patch whose `test` makes sure it removes
exactly that entry. Without the permission it logs the command that does the same by hand.
"""

from __future__ import annotations

import logging

import aiohttp

from horizonserve.operator import models
from horizonserve.operator.kube import Kube, KubeError
from horizonserve.operator.settings import FINALIZER

log = logging.getLogger(__name__)

JSON_PATCH = "application/json-patch+json"
_LIST = f"/apis/{models.GROUP}/{models.VERSION}/{models.PLURAL}"


async def remove_foreign_finalizers(kube: Kube, namespace: str) -> list[str]:
    """Remove our finalizer from OmniServices outside `namespace`; returns their names."""
    try:
        _, body = await kube.request("GET", _LIST)
    except (KubeError, OSError, aiohttp.ClientError) as exc:
        log.warning(
            "cannot list OmniServices outside namespace %s (%s): if an earlier cluster-wide "
            "install left its finalizer there, remove it with `kubectl patch omniservice NAME "
            "-n NS --type=json -p '[{\"op\":\"remove\",\"path\":\"/metadata/finalizers/I\"}]'`",
            namespace, exc,
        )  # fmt: skip
        return []
    released = []
    for item in (body or {}).get("items") or ():
        meta = item.get("metadata") or {}
        finalizers = meta.get("finalizers") or []
        if meta.get("namespace") == namespace or FINALIZER not in finalizers:
            continue
        i = finalizers.index(FINALIZER)
        path = f"/metadata/finalizers/{i}"
        patch = [{"op": "test", "path": path, "value": FINALIZER}, {"op": "remove", "path": path}]
        url = f"/apis/{models.GROUP}/{models.VERSION}/namespaces/{meta['namespace']}/"
        try:
            await kube.request(
                "PATCH", f"{url}{models.PLURAL}/{meta['name']}", patch, content_type=JSON_PATCH
            )
        except KubeError as exc:
            log.warning("releasing %s/%s failed: %s", meta["namespace"], meta["name"], exc)
            continue
        name = f"{meta['namespace']}/{meta['name']}"
        log.info("removed finalizer %s from %s (outside namespace %s)", FINALIZER, name, namespace)
        released.append(name)
    return released
