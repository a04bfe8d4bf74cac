"""Pod Security Standards, "restricted" profile (Kubernetes v1.25 definitions), written out.

Kubernetes 1.20 has no Pod Security admission, so the tests check pods against the rules
themselves: baseline (host namespaces, privileged, capabilities, hostPath, host ports,
AppArmor, SELinux, /proc mount, seccomp, sysctls) plus restricted (volume types, privilege
escalation, non-root, seccomp profile, capabilities drop ALL / add only NET_BIND_SERVICE).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range",
}  # fmt: skip
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t"}


def _containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or ()


def restricted_violations(spec: Mapping[str, Any], annotations: Mapping[str, str] | None = None
                          ) -> list[str]:  # fmt: skip
    """Every rule of the restricted profile the pod spec breaks ([] when it passes)."""
    out: list[str] = []
    psc = spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"{key} must be false")
    for vol in spec.get("volumes") or ():
        kinds = set(vol) - {"name"}
        if "hostPath" in kinds:
            out.append(f"volume {vol['name']}: hostPath")
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {vol['name']}: type {sorted(kinds - RESTRICTED_VOLUMES)}")
    for sysctl in psc.get("sysctls") or ():
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"sysctl {sysctl.get('name')} is not safe")
    if (psc.get("seLinuxOptions") or {}).get("type", "") not in SELINUX_TYPES:
        out.append("pod seLinuxOptions.type")
    pod_non_root = psc.get("runAsNonRoot") is True
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if psc.get("runAsUser") == 0:
        out.append("pod runAsUser 0")
    for key, value in (annotations or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            out.append(f"AppArmor {key}={value}")
    for c in _containers(spec):
        name = c.get("name")
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation must be false")
        if not (sc.get("runAsNonRoot") is True or (pod_non_root and "runAsNonRoot" not in sc)):
            out.append(f"{name}: runAsNonRoot must be true")
        if sc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or ()):
            out.append(f"{name}: capabilities must drop ALL")
        if set(caps.get("add") or ()) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: capabilities add {caps.get('add')}")
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"{name}: procMount {sc.get('procMount')}")
        if (sc.get("seLinuxOptions") or {}).get("type", "") not in SELINUX_TYPES:
            out.append(f"{name}: seLinuxOptions.type")
        if any(p.get("hostPort") for p in c.get("ports") or ()):
            out.append(f"{name}: hostPort")
    return out
