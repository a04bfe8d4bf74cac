"""Scale benchmark of the operator against a real kube-apiserver (not a test: not collected).

    .venv/bin/python -m tests.operator.bench_scale --nodes 100 500

For each N it starts from an empty cluster (tests/k8s control plane, no kubelet), creates N GPU
Node objects plus N/10 CPU-only ones, and measures two scenarios with the operator running
in-process (kopf, production intervals: status every 10 s, resync every 2 s):

* `apply`: the nodes exist, the operator is up; `kubectl apply` one OmniService → seconds
  until all N serving pods exist.
* `burst`: the OmniService exists with no node; N GPU nodes are created as fast as one client
  can → seconds from the first node until all N pods exist.

API requests are counted on the operator's side (every aiohttp request of the process: kopf's
watches, lists and patches and the operator's own writes), from the scenario start until 5 s
after the last pod appeared, so stragglers (duplicates, retries) are included. Raw results go
to bench/results/operator/scale-<N>.json and a summary table to bench/results/operator/
scale.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("HORIZONSERVE_LOG_LEVEL", "WARNING")

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from k8s.cluster import KubeCluster, find_binaries  # noqa: E402

from tests.operator.k8s_helpers import (  # noqa: E402
    OSVC_PATH,
    create_node,
    delete_all_nodes,
    install_crd,
    kopf_args,
    live,
    new_namespace,
    serving_pods,
)

SETTLE_S = 5.0
WRITE_METHODS = ("POST", "PATCH", "PUT", "DELETE")
IDLE_S = 20.0  # two status intervals
OUT = ROOT / "bench" / "results" / "operator"


class RequestCounter:
    """Counts every aiohttp request the process makes (kopf's and the operator's)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.enabled = False
        self._orig = aiohttp.ClientSession._request

    def install(self) -> None:
        counter = self
        orig = self._orig

        async def counting(session: Any, method: str, url: Any, *args: Any, **kw: Any) -> Any:
            if counter.enabled:
                counter.counts[f"{method.upper()} {_kind(str(url), kw)}"] += 1
            return await orig(session, method, url, *args, **kw)

        aiohttp.ClientSession._request = counting  # type: ignore[method-assign]

    def uninstall(self) -> None:
        aiohttp.ClientSession._request = self._orig  # type: ignore[method-assign]

    def window(self) -> collections.Counter[str]:
        return collections.Counter(self.counts)

    def reset(self) -> None:
        self.counts.clear()


def _kind(url: str, kw: dict[str, Any]) -> str:
    path = url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
    parts = path.split("/")
    if "namespaces" in parts and len(parts) > parts.index("namespaces") + 2:
        parts = parts[parts.index("namespaces") + 2 :]
    elif parts[0] == "api" and len(parts) > 2:
        parts = parts[2:]
    elif parts[0] == "apis" and len(parts) > 3:
        parts = parts[3:]
    resource = parts[0]
    if len(parts) >= 3:
        resource += f"/{parts[2]}"  # subresource
    watch = "watch=true" in url or (kw.get("params") or {}).get("watch") in ("true", True)
    return f"{resource}{' (watch)' if watch else ''}"


@contextlib.contextmanager
def running_operator(ns: str) -> Iterator[None]:
    from kopf.testing import KopfRunner

    with KopfRunner(kopf_args(ns), timeout=60):
        time.sleep(1.0)  # login, discovery, initial listings
        yield


def _apply(cluster: Any, ns: str) -> None:
    body = {
        "apiVersion": "horizonserve.io/v1alpha1",
        "kind": "OmniService",
        "metadata": {"name": "fleet"},
        "spec": {"pipeline": "qwen2_5_omni", "allGpuNodes": True},
    }
    status, resp = cluster.request("POST", OSVC_PATH.format(ns=ns), body)
    assert status == 201, resp


def _count_pods(cluster: Any, ns: str) -> int:
    """Pods in the namespace (only serving pods live there) without listing them all: a
    limit=1 page carries the remaining count, so polling stays cheap for the API server."""
    status, body = cluster.request("GET", f"/api/v1/namespaces/{ns}/pods?limit=1")
    assert status == 200, body
    return len(body["items"]) + int(body["metadata"].get("remainingItemCount") or 0)


def _wait_all(cluster: Any, ns: str, n: int, t0: float, timeout: float) -> tuple[float, int]:
    polls = 0
    while time.monotonic() - t0 < timeout:
        polls += 1
        if _count_pods(cluster, ns) >= n:
            return time.monotonic() - t0, polls
        time.sleep(0.05)
    raise TimeoutError(f"not all {n} pods after {timeout:.0f}s")


def _wait_status(cluster: Any, ns: str, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, osvc = cluster.request("GET", f"{OSVC_PATH.format(ns=ns)}/fleet")
        nodes = (osvc.get("status") or {}).get("nodeSummaries") or []
        if len(nodes) == n and all("pod" in x for x in nodes):
            return
        time.sleep(0.5)
    raise TimeoutError("status never showed every pod")


def _create_nodes(cluster: Any, n: int, prefix: str) -> None:
    for i in range(n):
        create_node(cluster, f"{prefix}-{i:04d}")


def scenario(cluster: Any, counter: RequestCounter, n: int, mode: str) -> dict[str, Any]:
    delete_all_nodes(cluster)
    ns = new_namespace(cluster, prefix=f"bench{n}")
    cpu = max(1, n // 10)
    for i in range(cpu):
        create_node(cluster, f"cpu-{i:04d}", gpu=False)
    if mode == "apply":
        _create_nodes(cluster, n, "gpu")
    with running_operator(ns):
        if mode == "burst":
            _apply(cluster, ns)
            time.sleep(2.0)  # the OmniService is handled, with no GPU node yet
        counter.reset()
        counter.enabled = True
        t0 = time.monotonic()
        if mode == "apply":
            _apply(cluster, ns)
            created_s = 0.0
        else:
            _create_nodes(cluster, n, "gpu")
            created_s = time.monotonic() - t0
        seconds, polls = _wait_all(cluster, ns, n, t0, timeout=600)
        time.sleep(SETTLE_S)
        counts = counter.window()
        counter.enabled = False
        pods = live(serving_pods(cluster, ns))
        names = [p["metadata"]["name"] for p in pods]
        # Idle: what the operator does once converged and the status shows it (no writes).
        _wait_status(cluster, ns, n)
        counter.reset()
        counter.enabled = True
        time.sleep(IDLE_S)
        idle = counter.window()
        counter.enabled = False
        cluster.request("DELETE", f"{OSVC_PATH.format(ns=ns)}/fleet")
        time.sleep(2.0)  # let the operator release its finalizer
    total = sum(counts.values())
    writes = sum(v for k, v in counts.items() if k.split()[0] in WRITE_METHODS)
    return {
        "mode": mode,
        "gpu_nodes": n,
        "cpu_nodes": cpu,
        "seconds_until_all_pods": round(seconds, 3),
        "seconds_creating_nodes": round(created_s, 3),
        "pods": len(pods),
        "duplicate_pod_names": len(names) - len(set(names)),
        "operator_requests": total,
        "operator_requests_per_node": round(total / n, 3),
        # POST/PATCH/PUT/DELETE: per node a ConfigMap and a pod; the rest is per OmniService
        # (identity, Service, status, finalizer) and the sidecars' Role patches as nodes come.
        "operator_writes_per_node": round(writes / n, 3),
        "operator_requests_by_kind": dict(sorted(counts.items())),
        f"idle_requests_per_{IDLE_S:.0f}s": dict(sorted(idle.items())),
        "window_s": round(seconds + SETTLE_S, 3),
        "bench_list_polls": polls,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--modes", nargs="+", default=["apply", "burst"])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    counter = RequestCounter()
    counter.install()
    rows = []
    with KubeCluster(
        find_binaries(build=True),
        controllers=("serviceaccount", "serviceaccount-token", "garbagecollector", "namespace"),
    ) as cluster:
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        os.environ.pop("KUBERNETES_SERVICE_HOST", None)
        install_crd(cluster)
        for n in args.nodes:
            results = []
            for mode in args.modes:
                r = scenario(cluster, counter, n, mode)
                print(json.dumps({k: v for k, v in r.items() if "by_kind" not in k}), flush=True)
                results.append(r)
                rows.append(r)
            meta = {
                "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.system()}",
                "kubernetes": (cluster.bin_dir / "VERSION").read_text().strip()
                if (cluster.bin_dir / "VERSION").exists()
                else "1.20",
                "command": "python -m tests.operator.bench_scale " + " ".join(argv or sys.argv[1:]),
            }
            path = args.out / f"scale-{n}.json"
            path.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    _write_table(args.out / "scale.md", rows)
    counter.uninstall()
    return 0


def _write_table(path: Path, rows: list[dict[str, Any]]) -> None:
    lines = [
        "| scenario | GPU nodes | seconds until all pods | operator API requests | per node | "
        "writes per node | duplicates |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['gpu_nodes']} | {r['seconds_until_all_pods']:.2f} | "
            f"{r['operator_requests']} | {r['operator_requests_per_node']:.2f} | "
            f"{r['operator_writes_per_node']:.2f} | {r['duplicate_pod_names']} |"
        )
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
