"""The chart with a real helm v3 binary: lint, render, offline validation of the rendered
objects (kubernetes-validate --strict), security settings, least-privilege RBAC, values that
must be refused, and the plain-YAML install being the chart's default render."""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..charts.chartlib import (
    CHART,
    CHART_CRDS,
    CRD_FILE,
    CRD_NAME,
    DEFAULT_NAMESPACE,
    DEFAULT_RELEASE,
    INSTALL_YAML,
    OPERATOR_COMMAND,
    ROOT,
    find,
    kubernetes_validate,
    load_docs,
    one,
)
from .helmlib import helm, rule_map, set_args, template, template_text

# Oldest and newest Kubernetes schemas bundled with kubernetes-validate. (1.20, the chart's
# kubeVersion floor, is what the end-to-end test's real API server runs.)
K8S_VERSIONS = ("1.25.0", "1.37.0")

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": {"operator.watchNamespace": "team-a"},
    "monitors": {"metrics.podMonitor.enabled": True, "metrics.serviceMonitor.enabled": True},
    "namespaced-monitors": {
        "operator.watchNamespace": "team-a",
        "metrics.podMonitor.enabled": True,
        "metrics.podMonitor.namespace": "monitoring",
        "metrics.serviceMonitor.enabled": True,
        "metrics.serviceMonitor.additionalLabels": {"release": "kube-prometheus-stack"},
    },
    "existing-service-account": {
        "serviceAccount.create": False,
        "serviceAccount.name": "preexisting",
        "fullnameOverride": "hs",
    },
    "no-rbac": {"rbac.create": False},
    "custom": {
        "image.tag": "0.1.0-rc1",
        "servingImage.repository": "registry.local/horizonserve-serving",
        "servingImage.tag": "dev",
        "operator.logLevel": "DEBUG",
        "operator.extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
        "imagePullSecrets": [{"name": "regcred"}],
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "podAnnotations": {"example.com/a": "b"},
        "podLabels": {"team": "ml"},
        "priorityClassName": "system-cluster-critical",
    },
}

MONITORING_KINDS = {"PodMonitor", "ServiceMonitor"}

V = ["get", "list", "watch"]
# The operator's RBAC contract: (apiGroup, resource) -> verbs.
NAMESPACED_RULES = {
    ("horizonserve.io", "omniservices"): {"list", "watch", "patch"},
    ("horizonserve.io", "omniservices/status"): {"patch"},
    ("", "pods"): {*V, "create", "delete"},
    ("", "configmaps"): {"get", "list", "watch", "create", "delete", "patch"},
    # `get` on a name taken: whose object is it (never patch or delete another's)
    ("", "services"): {"get", "create", "patch", "delete"},
    # the sidecars' identity, one per OmniService (the garbage collector deletes it)
    ("", "serviceaccounts"): {"get", "create"},
    ("rbac.authorization.k8s.io", "roles"): {"get", "create", "patch"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"get", "create"},
    # a referenced Secret's metadata (the label that allows its use), never listed
    ("", "secrets"): {"get"},
    ("", "events"): {"create"},
}
CLUSTER_SCOPED_RULES = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "nodes"): {"list", "watch"},
    ("node.k8s.io", "runtimeclasses"): {"list", "watch"},
    ("scheduling.k8s.io", "priorityclasses"): {"list", "watch"},
}
# Namespaced mode: the finalizer cleanup of OmniServices outside the namespace (cleanup.py).
NAMESPACED_MODE_ONLY_RULES = {("horizonserve.io", "omniservices"): {"list", "patch"}}
WEBHOOK_ENV = {
    "HORIZONSERVE_WEBHOOK_CERT_DIR": "/etc/horizonserve/webhook",
    "HORIZONSERVE_WEBHOOK_PORT": "9443",
}
# What a spec may ask for (values servingPolicy.*; operator/policy.py), at their defaults.
POLICY_ENV = {
    "HORIZONSERVE_ALLOWED_REGISTRIES": "",
    "HORIZONSERVE_ALLOWED_PRIORITY_CLASSES": "",
    "HORIZONSERVE_NODE_STATE_GRACE": "600",
}
# Model sources (values modelSource.*; operator/model_source.py), at their defaults.
MODEL_SOURCE_ENV = {
    "HORIZONSERVE_ALLOW_TRUST_REMOTE_CODE": "false",
    "HORIZONSERVE_IMAGE_VOLUMES": "false",
    "HORIZONSERVE_MODEL_CACHE_MAX": "",
}


def service(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    (svc,) = [
        d for d in find(docs, "Service")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]  # fmt: skip
    return svc


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deploy = one(docs, "Deployment")
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


# ------------------------------------------------------------------ lint and render


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint_strict(helm_bin: str, variant: str) -> None:
    res = helm(helm_bin, "lint", "--strict", str(CHART), *set_args(VARIANTS[variant]))
    assert "0 chart(s) failed" in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
def test_rendered_objects_validate_strictly(
    helm_bin: str, tmp_path: Path, variant: str, k8s_version: str
) -> None:
    """Every rendered object (CRD included) passes kubernetes-validate --strict; only the
    Prometheus Operator kinds, whose schemas it does not bundle, are exempt."""
    text = template_text(helm_bin, VARIANTS[variant], include_crds=True)
    docs = load_docs(text)
    assert docs, "nothing rendered"
    core = [d for d in docs if d["kind"] not in MONITORING_KINDS]
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(core, sort_keys=False))
    res = kubernetes_validate(path, k8s_version)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    passed = re.findall(r"passed for resource (\S+) against", out)
    assert len(passed) == len(core), f"validated {passed}, rendered {len(core)} objects:\n{out}"
    assert "Couldn't find schema" not in out, out


def test_default_render_objects(helm_bin: str) -> None:
    docs = template(helm_bin, include_crds=True)
    kinds = sorted(d["kind"] for d in docs)
    expected = [
        "ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount",
        "NetworkPolicy", "Secret", "Service", "ValidatingWebhookConfiguration",
    ]  # fmt: skip
    if (CHART_CRDS / CRD_FILE).exists():
        expected.append("CustomResourceDefinition")
    assert kinds == sorted(expected)
    for d in docs:
        if d["kind"] == "CustomResourceDefinition":
            continue
        labels = d["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "horizonserve"
        assert labels["app.kubernetes.io/instance"] == DEFAULT_RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"] == "0.1.0"
        assert labels["app.kubernetes.io/part-of"] == "horizonserve"
        assert labels["helm.sh/chart"] == "horizonserve-0.1.0"
        if d["kind"] in ("ServiceAccount", "Deployment", "Secret", "Service"):
            assert d["metadata"]["namespace"] == DEFAULT_NAMESPACE


# ------------------------------------------------------------------ the operator Deployment


def test_deployment_runs_one_operator_safely(helm_bin: str) -> None:
    docs = template(helm_bin)
    deploy = one(docs, "Deployment")
    spec = deploy["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()

    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True
    assert psc["runAsUser"] == 65532
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")

    c = container(docs)
    assert c["image"] == "ghcr.io/horizonserve/horizonserve-operator:0.1.0"
    assert c["command"] == OPERATOR_COMMAND
    assert "args" not in c
    sc = c["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["runAsNonRoot"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    res = c["resources"]
    assert set(res) == {"requests", "limits"}
    assert {"cpu", "memory"} <= set(res["requests"]) and {"cpu", "memory"} <= set(res["limits"])

    probe = c["livenessProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["ports"] == [
        {"name": "health", "containerPort": 8080, "protocol": "TCP"},
        {"name": "webhook", "containerPort": 9443, "protocol": "TCP"},
    ]
    # With a read-only root filesystem, /tmp is the only writable place.
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts == {"/tmp": "tmp", "/etc/horizonserve/webhook": "webhook-tls"}
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]

    assert env_of(c) == {
        "HORIZONSERVE_NAMESPACE": "",
        "HORIZONSERVE_SERVING_IMAGE": "ghcr.io/horizonserve/horizonserve-serving:0.1.0",
        "HORIZONSERVE_LOG_LEVEL": "INFO",
        **WEBHOOK_ENV,
        **MODEL_SOURCE_ENV,
        **POLICY_ENV,
    }


def test_model_source_values_reach_the_operator(helm_bin: str) -> None:
    values = {
        "modelSource.allowTrustRemoteCode": True,
        "modelSource.imageVolumes": True,
        "modelSource.maxCacheSize": "200Gi",
    }
    env = env_of(container(template(helm_bin, values)))
    assert env["HORIZONSERVE_ALLOW_TRUST_REMOTE_CODE"] == "true"
    assert env["HORIZONSERVE_IMAGE_VOLUMES"] == "true"
    assert env["HORIZONSERVE_MODEL_CACHE_MAX"] == "200Gi"
    # What the operator reads back from them.
    from horizonserve.operator.model_source import SourcePolicy

    assert SourcePolicy.from_env(env) == SourcePolicy(True, True, "200Gi")


def test_webhook_is_wired_to_the_operator_with_the_generated_certificate(helm_bin: str) -> None:
    import base64
    import ssl
    import tempfile

    docs = template(helm_bin)
    (config,) = find(docs, "ValidatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    assert hook["rules"][0]["resources"] == ["omniservices"]
    assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    client = hook["clientConfig"]
    svc = service(docs, "operator")
    assert client["service"]["name"] == svc["metadata"]["name"]
    assert client["service"]["path"] == "/validate-omniservice"
    assert svc["spec"]["ports"][0]["targetPort"] == "webhook"
    secret = one(docs, "Secret")
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "webhook-tls", "secret": {"secretName": secret["metadata"]["name"],
                                              "defaultMode": 0o440}} in volumes  # fmt: skip
    # The certificate verifies against the CA bundle for the Service's DNS name.
    with tempfile.TemporaryDirectory() as tmp:
        ca = Path(tmp) / "ca.crt"
        ca.write_bytes(base64.b64decode(client["caBundle"]))
        cert = Path(tmp) / "tls.crt"
        cert.write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
        key = Path(tmp) / "tls.key"
        key.write_bytes(base64.b64decode(secret["data"]["tls.key"]))
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(cert, key)  # the key matches the certificate
        res = subprocess.run(
            ["openssl", "verify", "-CAfile", str(ca), str(cert)], capture_output=True, text=True
        )
        assert res.returncode == 0, res.stderr
        text = subprocess.run(
            ["openssl", "x509", "-noout", "-text", "-in", str(cert)], capture_output=True,
            text=True, check=True,
        ).stdout  # fmt: skip
        assert f"DNS:{svc['metadata']['name']}.{DEFAULT_NAMESPACE}.svc" in text
    off = template(helm_bin, {"webhook.enabled": False})
    assert not find(off, "ValidatingWebhookConfiguration") and not find(off, "Secret")


def test_network_policies_admit_only_the_ports_in_use(helm_bin: str) -> None:
    docs = template(helm_bin, VARIANTS["namespaced"])
    policies = {p["metadata"]["name"]: p for p in find(docs, "NetworkPolicy")}
    operator = policies["horizonserve"]["spec"]
    assert [p["port"] for p in operator["ingress"][0]["ports"]] == ["health", "webhook"]
    serving = policies["horizonserve-serving"]
    assert serving["metadata"]["namespace"] == "team-a"
    assert [r["ports"][0]["port"] for r in serving["spec"]["ingress"]] == [8000, 9090]
    # The sidecar's metrics port admits Prometheus (the monitoring namespace), not anyone.
    monitoring = {"kubernetes.io/metadata.name": "monitoring"}
    assert serving["spec"]["ingress"][1]["from"] == [
        {"namespaceSelector": {"matchLabels": monitoring}}
    ]
    assert not find(template(helm_bin, {"networkPolicy.enabled": False}), "NetworkPolicy")


def test_custom_values_reach_the_deployment(helm_bin: str) -> None:
    docs = template(helm_bin, VARIANTS["custom"])
    c = container(docs)
    pod = one(docs, "Deployment")["spec"]["template"]
    assert c["image"] == "ghcr.io/horizonserve/horizonserve-operator:0.1.0-rc1"
    assert env_of(c) == {
        "HORIZONSERVE_NAMESPACE": "",
        "HORIZONSERVE_SERVING_IMAGE": "registry.local/horizonserve-serving:dev",
        "HORIZONSERVE_LOG_LEVEL": "DEBUG",
        **WEBHOOK_ENV,
        **MODEL_SOURCE_ENV,
        **POLICY_ENV,
        "HTTPS_PROXY": "http://proxy:3128",
    }
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    assert pod["spec"]["tolerations"][0]["key"] == "dedicated"
    assert pod["metadata"]["annotations"] == {
        "example.com/a": "b",
        "horizonserve.io/webhook-revision": "1",
    }
    assert pod["metadata"]["labels"]["team"] == "ml"


def test_openshift_style_ids_can_be_left_to_the_platform(helm_bin: str) -> None:
    docs = template(
        helm_bin,
        {
            "podSecurityContext.runAsUser": None,
            "podSecurityContext.runAsGroup": None,
            "podSecurityContext.fsGroup": None,
        },
    )
    psc = one(docs, "Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert psc == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


# ------------------------------------------------------------------ RBAC


def test_cluster_wide_rbac_is_exactly_the_contract(helm_bin: str) -> None:
    docs = template(helm_bin)
    assert not find(docs, "Role") and not find(docs, "RoleBinding")
    role = one(docs, "ClusterRole")
    # kopf never reads namespaces when it runs cluster-wide.
    assert rule_map(role["rules"]) == {**NAMESPACED_RULES, **CLUSTER_SCOPED_RULES}
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    sa = one(docs, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": DEFAULT_NAMESPACE}
    ]
    # Cluster-scoped names carry the release namespace: two installs cannot collide.
    assert role["metadata"]["name"] == f"horizonserve-{DEFAULT_NAMESPACE}"


def test_namespaced_mode_grants_namespaced_rules_in_that_namespace_only(helm_bin: str) -> None:
    docs = template(helm_bin, VARIANTS["namespaced"])
    assert env_of(container(docs))["HORIZONSERVE_NAMESPACE"] == "team-a"
    # Nodes and CRD discovery stay cluster-scoped; kopf resolves its namespace from the list.
    # kopf does not scan CRDs when it serves one namespace: no CRD rule there.
    cluster_scoped = {
        k: v for k, v in CLUSTER_SCOPED_RULES.items() if k[1] != "customresourcedefinitions"
    }
    assert rule_map(one(docs, "ClusterRole")["rules"]) == {
        **cluster_scoped,
        **NAMESPACED_MODE_ONLY_RULES,
    }
    role = one(docs, "Role")
    assert role["metadata"]["namespace"] == "team-a"
    assert rule_map(role["rules"]) == NAMESPACED_RULES
    binding = one(docs, "RoleBinding")
    assert binding["metadata"]["namespace"] == "team-a"
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["namespace"] == DEFAULT_NAMESPACE  # the operator's own ns
    assert one(docs, "ClusterRoleBinding")["roleRef"]["kind"] == "ClusterRole"


@pytest.mark.parametrize("variant", ["default", "namespaced"])
def test_every_rbac_rule_is_commented_and_least_privilege(helm_bin: str, variant: str) -> None:
    text = template_text(helm_bin, VARIANTS[variant])
    for chunk in text.split("\n---\n"):
        if not re.search(r"^kind: (Cluster)?Role$", chunk, re.M):
            continue
        lines = chunk.splitlines()
        rule_lines = [i for i, line in enumerate(lines) if line.strip().startswith("- apiGroups")]
        assert rule_lines
        for i in rule_lines:
            assert lines[i - 1].strip().startswith("#"), (
                f"RBAC rule without a comment saying why it is needed:\n{lines[i]}\n"
                f"(after {lines[i - 1]!r})"
            )
    for role in find(load_docs(text), "ClusterRole") + find(load_docs(text), "Role"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], f"wildcard in {role['kind']}: {rule}"
            forbidden = {"escalate", "bind", "impersonate", "deletecollection"}
            assert not forbidden & set(rule["verbs"]), rule
            # Secrets: `get` only (a referenced Secret's labels, read as metadata), never
            # list or watch (that would read every Secret of the namespace).
            if "secrets" in rule["resources"]:
                assert rule["verbs"] == ["get"] and rule["resources"] == ["secrets"], rule


def _webhook_selector(helm_bin: str, values: dict[str, Any], kube: str) -> list[dict]:
    docs = template(helm_bin, values, extra=("--kube-version", kube))
    (hook,) = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    return hook["namespaceSelector"]["matchExpressions"]


def test_webhook_scope_spares_other_namespaces_and_the_operators(helm_bin: str) -> None:
    opt_out = {"key": "horizonserve.io/webhook", "operator": "NotIn", "values": ["disabled"]}
    name = "kubernetes.io/metadata.name"
    # Namespaced mode: the watched namespace only, so a restart blocks no other namespace
    # and the finalizer release elsewhere never meets the webhook.
    assert _webhook_selector(helm_bin, VARIANTS["namespaced"], "1.21.0") == [
        opt_out, {"key": name, "operator": "In", "values": ["team-a"]},
    ]  # fmt: skip
    # Cluster-wide: every namespace but the operator's own.
    assert _webhook_selector(helm_bin, {}, "1.30.0") == [
        opt_out, {"key": name, "operator": "NotIn", "values": [DEFAULT_NAMESPACE]},
    ]  # fmt: skip
    # Before 1.21 namespaces carry no name label: only the opt-out.
    assert _webhook_selector(helm_bin, VARIANTS["namespaced"], "1.20.2") == [opt_out]


def test_admission_policy_only_where_served_and_with_the_chart_policy(helm_bin: str) -> None:
    assert not find(template(helm_bin), "ValidatingAdmissionPolicy")
    served = ("--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")
    docs = template(helm_bin, extra=served)
    (policy,) = [p for p in find(docs, "ValidatingAdmissionPolicy")
                 if not p["metadata"]["name"].endswith("-node-state")]  # fmt: skip
    bindings = find(docs, "ValidatingAdmissionPolicyBinding")
    assert sorted(b["spec"]["policyName"] for b in bindings) == sorted(
        p["metadata"]["name"] for p in find(docs, "ValidatingAdmissionPolicy")
    )
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    rules = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert '["ghcr.io"]' in rules  # the chart's own serving image's registry by default
    assert "startsWith('system-')" in rules and "startsWith('-')" in rules
    docs = template(
        helm_bin,
        {
            "servingPolicy.registries": ["registry.example:5000"],
            "servingPolicy.priorityClasses": ["gpu-serving"],
        },
        extra=served,
    )
    rules = " ".join(v["expression"] for p in find(docs, "ValidatingAdmissionPolicy")
                     for v in p["spec"]["validations"])  # fmt: skip
    assert '["registry.example:5000"]' in rules and '["gpu-serving"]' in rules
    # A node speaks only for itself (1.30+ tokens carry the pod's node): a sidecar may update
    # only its own node's ConfigMap, never its labels or annotations.
    (node_state,) = [p for p in find(docs, "ValidatingAdmissionPolicy")
                     if p["metadata"]["name"].endswith("-node-state")]  # fmt: skip
    spec = node_state["spec"]
    assert spec["matchConstraints"]["resourceRules"][0]["resources"] == ["configmaps"]
    assert spec["matchConstraints"]["objectSelector"]["matchLabels"] == {
        "app.kubernetes.io/component": "node-state",
        "app.kubernetes.io/managed-by": "horizonserve-operator",
    }
    assert "-sidecar" in spec["matchConditions"][0]["expression"]
    checks = " ".join(v["expression"] for v in spec["validations"])
    assert "authentication.kubernetes.io/node-name" in checks
    assert "horizonserve.io/node-name" in checks and "oldObject.metadata.labels" in checks
    # spec.modelSource / spec.engineArgs (operator/model_source.py): one kind, the weights
    # image's registry, --trust-remote-code only where the chart allows it.
    assert "has(object.spec.modelSource.pvc)" in rules and "variables.weightsRegistry" in rules
    assert "trustRemoteCode" in rules
    docs = template(helm_bin, {"modelSource.allowTrustRemoteCode": True}, extra=served)
    rules = " ".join(v["expression"] for p in find(docs, "ValidatingAdmissionPolicy")
                     for v in p["spec"]["validations"])  # fmt: skip
    assert "trustRemoteCode" not in rules and "weightsRegistry" in rules


def test_existing_service_account_and_no_rbac(helm_bin: str) -> None:
    docs = template(helm_bin, VARIANTS["existing-service-account"])
    assert not find(docs, "ServiceAccount")
    assert one(docs, "Deployment")["metadata"]["name"] == "hs"
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == (
        "preexisting"
    )
    assert one(docs, "ClusterRoleBinding")["subjects"][0]["name"] == "preexisting"
    docs = template(helm_bin, VARIANTS["no-rbac"])
    assert sorted(d["kind"] for d in docs) == [
        "Deployment", "NetworkPolicy", "Secret", "Service", "ServiceAccount",
        "ValidatingWebhookConfiguration",
    ]  # fmt: skip


# ------------------------------------------------------------------ monitoring


def test_monitors_select_the_serving_pods(helm_bin: str) -> None:
    docs = template(helm_bin, VARIANTS["monitors"])
    values_selector = {
        "app.kubernetes.io/name": "horizonserve",
        "app.kubernetes.io/component": "serving",
        "app.kubernetes.io/managed-by": "horizonserve-operator",
    }
    pm = one(docs, "PodMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["spec"]["selector"]["matchLabels"] == values_selector
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert pm["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"
    svc = service(docs, "metrics")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == values_selector
    assert svc["metadata"]["namespace"] == DEFAULT_NAMESPACE
    sm = one(docs, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [DEFAULT_NAMESPACE]}
    for d in (pm, sm, svc):
        assert d["metadata"]["labels"]["app.kubernetes.io/component"] == "metrics"
    # The operator's Deployment must not be selected by the ServiceMonitor's Service.
    deploy_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not svc["spec"]["selector"].items() <= deploy_labels.items()


def test_monitors_in_namespaced_mode(helm_bin: str) -> None:
    docs = template(helm_bin, VARIANTS["namespaced-monitors"])
    pm = one(docs, "PodMonitor")
    assert pm["metadata"]["namespace"] == "monitoring"
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}
    svc = service(docs, "metrics")
    sm = one(docs, "ServiceMonitor")
    assert svc["metadata"]["namespace"] == sm["metadata"]["namespace"] == "team-a"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"


# ------------------------------------------------------------------ values that must be refused

BAD_VALUES: dict[str, tuple[dict[str, Any], str]] = {
    "replicas": ({"replicaCount": 2}, "replicaCount"),
    "unknown-key": ({"operator.watchNamespaces": "a"}, "watchNamespaces"),
    "pull-policy": ({"image.pullPolicy": "Sometimes"}, "pullPolicy"),
    "log-level": ({"operator.logLevel": "LOUD"}, "logLevel"),
    "namespace-name": ({"operator.watchNamespace": "Team_A"}, "watchNamespace"),
    "privileged": ({"securityContext.privileged": True}, "privileged"),
    "escalation": ({"securityContext.allowPrivilegeEscalation": True}, "allowPrivilegeEscalation"),
    "root": ({"podSecurityContext.runAsNonRoot": False}, "runAsNonRoot"),
    "uid-0": ({"podSecurityContext.runAsUser": 0}, "runAsUser"),
    "capabilities": ({"securityContext.capabilities.add": ["NET_ADMIN"]}, "capabilities.add"),
    "keep-caps": ({"securityContext.capabilities.drop": ["NET_RAW"]}, "capabilities.drop"),
    "unconfined": ({"podSecurityContext.seccompProfile.type": "Unconfined"}, "seccompProfile"),
    "no-limits": ({"resources.limits": None}, "limits"),
    "sa-without-name": ({"serviceAccount.create": False}, "serviceAccount"),
    "port": ({"metrics.port": 70000}, "metrics.port"),
    "interval": ({"metrics.podMonitor.interval": "often"}, "interval"),
    "empty-selector": (
        {
            "metrics.servingPodSelector": {
                "app.kubernetes.io/name": None,
                "app.kubernetes.io/component": None,
                "app.kubernetes.io/managed-by": None,
            }
        },
        "servingPodSelector",
    ),
    "reserved-env": (
        {"operator.extraEnv": [{"name": "HORIZONSERVE_NAMESPACE", "value": "x"}]},
        "extraEnv",
    ),
    "probe-type": ({"operator.livenessProbe.periodSeconds": "20"}, "periodSeconds"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_values_are_refused_by_template_and_lint(helm_bin: str, case: str) -> None:
    values, where = BAD_VALUES[case]
    args = set_args(values)
    res = helm(helm_bin, "template", "x", str(CHART), *args, check=False)
    assert res.returncode != 0, f"helm template accepted {values}"
    assert "values don't meet the specifications of the schema" in res.stderr, res.stderr
    assert where in res.stderr, res.stderr
    res = helm(helm_bin, "lint", str(CHART), *args, check=False)
    assert res.returncode != 0, f"helm lint accepted {values}"
    assert where in res.stdout + res.stderr


# ------------------------------------------------------------------ the plain-YAML install


def test_install_yaml_is_the_default_render(helm_bin: str) -> None:
    """manifests/install.yaml = a Namespace + `helm template` with default values, CRDs
    included, byte for byte (charts/sync-crds.sh writes it)."""
    assert INSTALL_YAML.exists(), "run `bash charts/sync-crds.sh`"
    text = INSTALL_YAML.read_text()
    rendered = template_text(helm_bin, {"webhook.enabled": False}, include_crds=True)
    assert text.endswith(rendered), (
        "manifests/install.yaml is not the chart's default render: run `bash charts/sync-crds.sh`"
    )
    head = load_docs(text[: len(text) - len(rendered)])
    assert head == [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": DEFAULT_NAMESPACE,
                "labels": {
                    "app.kubernetes.io/name": "horizonserve",
                    "app.kubernetes.io/part-of": "horizonserve",
                },
            },
        }
    ]
    docs = load_docs(text)
    assert one(docs, "CustomResourceDefinition")["metadata"]["name"] == CRD_NAME


def test_sync_script_reports_up_to_date(helm_bin: str) -> None:
    res = subprocess.run(
        ["bash", str(ROOT / "charts" / "sync-crds.sh"), "--check"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "HELM": helm_bin},
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "up to date" in res.stderr


def test_chart_packages(helm_bin: str, tmp_path: Path) -> None:
    """`helm package` works and ships the CRD, the schema and the README, but no scripts."""
    helm(helm_bin, "package", str(CHART), "--destination", str(tmp_path))
    (pkg,) = tmp_path.glob("horizonserve-0.1.0.tgz")
    with tarfile.open(pkg) as tar:
        names = set(tar.getnames())
    assert "horizonserve/values.schema.json" in names
    assert "horizonserve/README.md" in names
    assert "horizonserve/templates/NOTES.txt" in names
    assert f"horizonserve/crds/{CRD_FILE}" in names
    assert not [n for n in names if n.endswith(".sh")]
