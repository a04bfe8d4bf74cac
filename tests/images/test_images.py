"""The container images images/build.sh builds, run with podman (tests/images/conftest.py):

* the reference serving image answers `horizonserve serve --preset tiny --device cpu` on
  loopback (health, one request end to end, /metrics);
* the operator image starts against the real kube-apiserver (tests/k8s), with the chart's
  namespaced RBAC, and creates one serving pod per GPU node of an OmniService.
"""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.cluster import wait_for
from tests.operator.k8s_helpers import (
    create_node,
    delete_all_nodes,
    install_crd,
    live,
    new_namespace,
    operator_kubeconfig,
    pod_node,
    serving_pods,
)

from .conftest import container, free_port, http, logs, running, up

pytestmark = pytest.mark.images


def test_serving_image_answers_on_loopback(serving_image: str) -> None:
    port = free_port()
    cmd = ["horizonserve", "serve", "--preset", "tiny", "--device", "cpu", "--host",
           "127.0.0.1", "--port", str(port), "--no-warmup"]  # fmt: skip
    with container(serving_image, cmd) as name:
        base = f"http://127.0.0.1:{port}"
        wait_for(
            "the serving container's /health",
            lambda: up(f"{base}/health") or not running(name),
            timeout=180,
        )
        assert running(name), logs(name)[-3000:]
        assert http(f"{base}/health")[0] == 200  # the probes' path
        status, raw = http(f"{base}/healthz")
        assert status == 200 and json.loads(raw)["ok"], raw
        status, raw = http(f"{base}/v1/requests", {"priority": 0, "output_tokens": 4})
        assert status == 200, raw
        answer = json.loads(raw)
        assert answer, raw
        status, raw = http(f"{base}/metrics")
        assert status == 200 and b"horizonserve" in raw
        text = logs(name)
        assert "listening on" in text and "Traceback" not in text, text[-3000:]


def _readable_by_all(path: Path) -> None:
    path.chmod(path.stat().st_mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)


def test_operator_image_creates_pods(
    operator_image: str, kube_cluster: Any, tmp_path: Path
) -> None:
    cluster = kube_cluster
    install_crd(cluster)
    status, body = cluster.request(
        "POST",
        "/apis/node.k8s.io/v1/runtimeclasses",
        {"metadata": {"name": "nvidia"}, "handler": "nvidia"},
    )
    assert status in (201, 409), body
    delete_all_nodes(cluster)
    ns = new_namespace(cluster, "img")
    nodes = {f"gpu-{i}" for i in range(3)}
    for node in sorted(nodes):
        create_node(cluster, node, labels={"horizonserve.io/pool": "images"})
    # The container runs as 65532: hand it a world-readable folder with the kubeconfig (the
    # chart's namespaced RBAC, as a ServiceAccount token) and the API server's CA.
    kube = tmp_path / "kube"
    kube.mkdir()
    kube.chmod(0o755)
    config = json.loads(operator_kubeconfig(cluster, ns, kube / "config").read_text())
    (kube / "ca.crt").write_bytes(Path(cluster.ca_file).read_bytes())
    config["clusters"][0]["cluster"]["certificate-authority"] = "/kube/ca.crt"
    (kube / "config").write_text(json.dumps(config))
    for f in kube.iterdir():
        _readable_by_all(f)
    port = free_port()
    env = {
        "KUBECONFIG": "/kube/config",
        "HORIZONSERVE_NAMESPACE": ns,
        "HORIZONSERVE_STATUS_INTERVAL": "1",
        "HORIZONSERVE_RESYNC_INTERVAL": "1",
        "HORIZONSERVE_LIVENESS": f"http://127.0.0.1:{port}/healthz",
    }
    args = ["-v", f"{kube}:/kube:ro"]
    for k, v in env.items():
        args += ["-e", f"{k}={v}"]
    manifest = "apiVersion: horizonserve.io/v1alpha1\nkind: OmniService\n" \
        "metadata: {name: fleet}\nspec: {pipeline: mimo_audio, " \
        "nodeSelector: {horizonserve.io/pool: images}}\n"  # fmt: skip
    t0 = time.monotonic()
    with container(operator_image, [], args) as name:
        wait_for(
            "the operator container's liveness endpoint",
            lambda: up(f"http://127.0.0.1:{port}/healthz") or not running(name),
            timeout=120,
        )
        assert running(name), logs(name)[-3000:]
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=manifest)
        try:
            wait_for(
                "one serving pod per GPU node",
                lambda: len(live(serving_pods(cluster, ns))) == len(nodes),
                timeout=120,
            )
        except AssertionError as exc:
            text = "\n".join(x for x in logs(name).splitlines() if "succeeded." not in x)
            raise AssertionError(f"{exc}\noperator log:\n{text[-6000:]}") from None
        pods = live(serving_pods(cluster, ns))
        assert {pod_node(p) for p in pods} == nodes
        text = logs(name)
        cluster.kubectl("delete", "osvc", "-n", ns, "fleet", "--wait=true", "--timeout=60s")
    assert time.monotonic() - t0 < 240
    assert "Traceback" not in text and "forbidden" not in text.lower(), text[-4000:]
    cluster.request("DELETE", f"/api/v1/namespaces/{ns}")
