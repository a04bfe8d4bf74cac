"""Namespaced mode: release OmniServices outside the watched namespace.

An operator that ran cluster-wide left its finalizer (`settings.FINALIZER`) on OmniServices in
every namespace. Once it serves one namespace only, nobody would remove the finalizer
elsewhere, and deleting those OmniServices would hang. At start, the namespaced operator lists
OmniServices cluster-wide (a `list` the chart grants for this) and removes only its finalizer
from the ones outside its namespace, with a JSON patch whose `test` makes sure it removes
exactly that entry. Without the permission it logs the command that does the same by hand.

The release runs in the background and is retried (backoff up to a limit) until a listing
finds nothing left to release: its writes may have to pass this operator's own validating
webhook, which serves only once the operator is up, and a transient API error must not leave
an OmniService Terminating for ever.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from horizonserve.operator import models
from horizonserve.operator.kube import Kube, KubeError
from horizonserve.operator.settings import FINALIZER

log = logging.getLogger(__name__)

JSON_PATCH = "application/json-patch+json"
_LIST = f"/apis/{models.GROUP}/{models.VERSION}/{models.PLURAL}"


class Pending(RuntimeError):
    """Some finalizer could not be released yet (the attempt is retried)."""


async def release_until_done(
    kube: Kube, namespace: str, first_wait_s: float = 1.0, max_wait_s: float = 30.0
) -> list[str]:
    """`remove_foreign_finalizers` until an attempt leaves nothing pending; returns every
    OmniService released. Runs until done (the caller cancels it at shutdown)."""
    released: list[str] = []
    wait = first_wait_s
    attempt = 0
    while True:
        attempt += 1
        try:
            released += await remove_foreign_finalizers(kube, namespace, strict=True)
            return released
        except (Pending, KubeError, OSError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning(
                "releasing finalizers outside namespace %s, attempt %d: %s; retrying in %.0fs",
                namespace, attempt, exc, wait,
            )  # fmt: skip
        await asyncio.sleep(wait)
        wait = min(max_wait_s, wait * 2)


async def remove_foreign_finalizers(
    kube: Kube, namespace: str, *, strict: bool = False
) -> list[str]:
    """Remove our finalizer from OmniServices outside `namespace`; returns their names.

    With `strict`, a failed listing or release raises (`Pending` for a release) after the
    others were tried, so that the caller retries."""
    try:
        _, body = await kube.request("GET", _LIST)
    except (KubeError, OSError, aiohttp.ClientError) as exc:
        log.warning(
            "cannot list OmniServices outside namespace %s (%s): if an earlier cluster-wide "
            "install left its finalizer there, remove it with `kubectl patch omniservice NAME "
            "-n NS --type=json -p '[{\"op\":\"remove\",\"path\":\"/metadata/finalizers/I\"}]'`",
            namespace, exc,
        )  # fmt: skip
        if strict and not (isinstance(exc, KubeError) and exc.status == 403):
            raise
        return []
    released = []
    failed: list[str] = []
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
            if exc.status in (403, 404):  # not granted (retrying cannot help), or gone
                continue
            # Anything else (the webhook not serving yet, a change in between): list again.
            failed.append(f"{meta['namespace']}/{meta['name']} ({exc})")
            continue
        name = f"{meta['namespace']}/{meta['name']}"
        log.info("removed finalizer %s from %s (outside namespace %s)", FINALIZER, name, namespace)
        released.append(name)
    if strict and failed:
        raise Pending(f"not released yet: {'; '.join(failed)}")
    return released
