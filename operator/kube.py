"""A small async Kubernetes REST client for the children the operator writes.

kopf watches and patches the OmniService itself; this client only creates, patches and
deletes the namespaced children (pods, the per-node ConfigMap, the sidecars' ServiceAccount,
Role and RoleBinding, the Service). It patches and deletes only objects whose owner reference
names the OmniService (`create_owned`, uid preconditions on deletes). It shares kopf's
event loop (aiohttp, no thread pool), counts its requests (the scale benchmark reports them)
and takes its credentials from the `kubernetes` package's config loaders, so in-cluster
service-account tokens and kubeconfig files work the same way they do for kopf's own login.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import ssl
from collections.abc import Mapping
from typing import Any, Literal

import aiohttp

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"

_PATHS = {
    ("v1", "Pod"): "/api/v1/namespaces/{ns}/pods",
    ("v1", "ServiceAccount"): "/api/v1/namespaces/{ns}/serviceaccounts",
    ("v1", "ConfigMap"): "/api/v1/namespaces/{ns}/configmaps",
    ("v1", "Service"): "/api/v1/namespaces/{ns}/services",
    ("rbac.authorization.k8s.io/v1", "Role"): (
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles"
    ),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): (
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings"
    ),
}


class KubeError(RuntimeError):
    """An API call failed with a status other than the ones the caller tolerates."""

    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        try:
            message = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            message = body
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    try:
        return _PATHS[(api_version, kind)].format(ns=namespace)
    except KeyError:
        raise ValueError(f"no path known for {api_version} {kind}") from None


def object_path(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    base = collection_path(obj["apiVersion"], obj["kind"], meta["namespace"])
    return f"{base}/{meta['name']}"


class Kube:
    """Create / patch / delete with the tolerances an idempotent controller wants."""

    def __init__(
        self,
        server: str,
        *,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | bool | None = None,
        token_refresh: Any = None,
        timeout_s: float = 30.0,
        max_concurrency: int = 32,
    ) -> None:
        self.server = server.rstrip("/")
        self._headers = dict(headers or {})
        self._ssl = ssl_context
        self._token_refresh = token_refresh
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._limit = asyncio.Semaphore(max_concurrency)
        self.requests: collections.Counter[str] = collections.Counter()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers_now(self) -> dict[str, str]:
        if self._token_refresh is not None:
            token = self._token_refresh()
            if token:
                self._headers["Authorization"] = token
        return self._headers

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (),
        accept: str = "application/json",
    ) -> tuple[int, Any]:
        """One call; returns (status, parsed body). Raises KubeError unless 2xx or in `ok`."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        headers = {**self._headers_now(), "Accept": accept}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body, separators=(",", ":"))
        self.requests[f"{method} {_resource_of(path)}"] += 1
        async with (
            self._limit,
            self._session.request(
                method, self.server + path, data=data, headers=headers, ssl=self._ssl
            ) as resp,
        ):
            text = await resp.text()
        if 200 <= resp.status < 300 or resp.status in ok:
            try:
                return resp.status, json.loads(text) if text else None
            except ValueError:
                return resp.status, text
        raise KubeError(resp.status, method, path, text)

    async def create(self, obj: Mapping[str, Any]) -> Literal["created", "exists"]:
        meta = obj["metadata"]
        path = collection_path(obj["apiVersion"], obj["kind"], meta["namespace"])
        status, _ = await self.request("POST", path, obj, ok=(409,))
        return "exists" if status == 409 else "created"

    async def get(self, obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The object as stored, or None when it does not exist."""
        status, body = await self.request("GET", object_path(obj), ok=(404,))
        return None if status == 404 else body

    async def create_owned(
        self, obj: Mapping[str, Any], owner_uid: str
    ) -> tuple[Literal["created", "ours", "foreign", "gone"], Mapping[str, Any] | None]:
        """Create; when the name is taken, tell whether the stored object is ours (an owner
        reference with `owner_uid`). Returns the stored object (created or ours). A foreign
        object is never touched."""
        meta = obj["metadata"]
        path = collection_path(obj["apiVersion"], obj["kind"], meta["namespace"])
        status, created = await self.request("POST", path, obj, ok=(409,))
        if status != 409:
            return "created", created
        existing = await self.get(obj)
        if existing is None:  # deleted in between: the next pass creates it
            return "gone", None
        return ("ours" if owned_by(existing, owner_uid) else "foreign"), existing

    async def patch(self, obj: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
        """Merge-patch; False when the object is gone."""
        status, _ = await self.request(
            "PATCH", object_path(obj), patch, content_type=MERGE_PATCH, ok=(404,)
        )
        return status != 404

    async def ensure(
        self, obj: Mapping[str, Any], patch: Mapping[str, Any] | None = None
    ) -> Literal["created", "patched", "exists"]:
        """Create, or when it exists and `patch` is given, merge-patch it."""
        if await self.create(obj) == "created":
            return "created"
        if patch is None:
            return "exists"
        await self.patch(obj, patch)
        return "patched"

    async def delete(
        self, api_version: str, kind: str, namespace: str, name: str, uid: str | None = None
    ) -> Literal["deleted", "gone"]:
        """Delete (background propagation); a uid precondition spares a same-named successor."""
        path = f"{collection_path(api_version, kind, namespace)}/{name}"
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        body["propagationPolicy"] = "Background"
        if uid:
            body["preconditions"] = {"uid": uid}
        status, _ = await self.request("DELETE", path, body, ok=(404, 409))
        return "gone" if status in (404, 409) else "deleted"


def owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    """An owner reference of the object names `owner_uid` (our OmniService)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return bool(owner_uid) and any(r.get("uid") == owner_uid for r in refs)


def _resource_of(path: str) -> str:
    """`/api/v1/namespaces/ns/pods/x` → `pods` (for the request counter)."""
    parts = [p for p in path.split("/") if p]
    if "namespaces" in parts:
        i = parts.index("namespaces")
        return parts[i + 2] if len(parts) > i + 2 else "namespaces"
    return parts[-1] if parts else ""


def client_configuration() -> Any:
    """`kubernetes.client.Configuration` from the in-cluster service account, else KUBECONFIG.

    KUBECONFIG is read now, not when `kubernetes` was imported (its default path is frozen at
    import time), so tests and tools that set it later are honoured.
    """
    import os

    from kubernetes import client, config

    cfg = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(
            config_file=os.environ.get("KUBECONFIG") or None, client_configuration=cfg
        )
    return cfg


def bearer_token(cfg: Any) -> str | None:
    """`Bearer <token>` (re-reading rotated service-account tokens through the config's hook)."""
    return (cfg.auth_settings().get("BearerToken") or {}).get("value")


def from_environment(**kwargs: Any) -> Kube:
    """A client with the same credentials as `client_configuration()`."""
    cfg = client_configuration()
    ctx: ssl.SSLContext | None = None
    if cfg.host.startswith("https"):
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert if cfg.verify_ssl else None)
        if not cfg.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return Kube(cfg.host, ssl_context=ctx, token_refresh=lambda: bearer_token(cfg), **kwargs)
