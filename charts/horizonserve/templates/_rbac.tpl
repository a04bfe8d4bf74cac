{{/*
The operator's RBAC rules, in two sets:

- "horizonserve.rbac.clusterScopedRules": objects that exist only at cluster scope (nodes,
  CRDs) and, in namespaced mode, the one cluster-wide OmniService read the finalizer cleanup
  needs. Always granted by a ClusterRole.
- "horizonserve.rbac.namespacedRules": objects that live in namespaces (OmniServices, serving
  pods, their ConfigMaps, Services and the sidecars' RBAC, events). Granted by a Role in
  operator.watchNamespace in namespaced mode (nothing of it anywhere else), or by the
  ClusterRole in cluster-wide mode: OmniServices may then live in any namespace, and a Role can
  only be granted per namespace, so the pod / ServiceAccount / RBAC writes are cluster-wide.
  That mode grants creating pods, ServiceAccounts, Roles and RoleBindings in every namespace,
  kube-system included; pick namespaced mode where that is too much.

Only the verbs the operator uses (tests/k8s/test_trust.py compares these rules with the
API server's audit log of an end-to-end run). No wildcards, no `get` where the index serves
(`get` only to check who owns an object whose name is taken), no `update`, no
`deletecollection`, no `bind`/`escalate`; secrets: `get` of their metadata only
(PartialObjectMetadata), to check the label that allows an OmniService to use one. The Role
the operator makes for an OmniService's sidecars holds only `configmaps patch` on that
OmniService's node ConfigMaps, which the operator holds itself at the same scope, so the
escalation check lets it create that Role and its RoleBinding without `escalate`/`bind`.
*/}}

{{- define "horizonserve.rbac.clusterScopedRules" -}}
{{- if not .Values.operator.watchNamespace }}
# Cluster-wide mode only: kopf lists + watches CRDs to find the OmniService CRD before
# watching it and to notice it being upgraded or removed (in namespaced mode it does not scan).
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end }}
# The GPU node index (kopf.index): list + watch /api/v1/nodes. Read-only.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
# Which RuntimeClasses and PriorityClasses exist (kopf.index, read-only): an OmniService whose
# class is missing can run no pod, so it owns no node.
- apiGroups: ["node.k8s.io"]
  resources: ["runtimeclasses"]
  verbs: ["list", "watch"]
# (the PriorityClass index, likewise)
- apiGroups: ["scheduling.k8s.io"]
  resources: ["priorityclasses"]
  verbs: ["list", "watch"]
{{- if .Values.operator.watchNamespace }}
# Namespaced mode, at start until done (operator/cleanup.py): GET /apis/horizonserve.io/v1alpha1/
# omniservices, and a JSON PATCH removing only horizonserve.io/finalizer from OmniServices
# outside the watched namespace (left there by an earlier cluster-wide install; their
# deletion would hang otherwise). The operator changes nothing else outside its namespace.
- apiGroups: ["horizonserve.io"]
  resources: ["omniservices"]
  verbs: ["list", "patch"]
{{- end }}
{{- end }}

{{- define "horizonserve.rbac.namespacedRules" -}}
# kopf: list + watch OmniServices; PATCH them for its finalizer and its progress and
# last-handled-configuration annotations. The operator never creates or deletes them.
- apiGroups: ["horizonserve.io"]
  resources: ["omniservices"]
  verbs: ["list", "watch", "patch"]
# PATCH .../omniservices/NAME/status: conditions, nodes, attainment, endpoint (status timer).
- apiGroups: ["horizonserve.io"]
  resources: ["omniservices/status"]
  verbs: ["patch"]
# Serving pods: list + watch (pod index), POST one per node, DELETE (node gone, rollout,
# drift); GET only after a create met 409, to tell its own pod from a stranger's.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"]
# Each node's ConfigMap (calibration artifacts + summary): list + watch (index), POST empty
# (the sidecar may only patch it), GET after a create met 409 (whose is it?), DELETE once the
# node has left for the grace period. `patch` is not called by the operator: it is held so
# that it may grant `patch` on those ConfigMaps to the sidecars' Role.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# The Service per OmniService: POST; GET after a 409 (a Service of that name that is not the
# OmniService's is never patched nor deleted); PATCH (internalTrafficPolicy), DELETE
# (service.enabled false), both only on its own.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch", "delete"]
# The sidecars' identity, one per OmniService: POST the ServiceAccount, RoleBinding and Role,
# GET after a 409 (ownership), PATCH the Role's ConfigMap names as nodes come and go. Owned
# by the OmniService (the garbage collector deletes them with it).
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create"]
# (the RoleBinding of that ServiceAccount to the Role below: POST, GET after a 409)
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["rolebindings"]
  verbs: ["get", "create"]
# (the Role: POST, GET after a 409, PATCH its resourceNames; never an empty list)
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles"]
  verbs: ["get", "create", "patch"]
# `spec.apiKeySecret`: GET the Secret's metadata (PartialObjectMetadata, never its data) for
# the label horizonserve.io/api-key=allowed, set by whoever may read the Secret.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
# kopf: POST /api/v1/namespaces/NS/events: Warning Events (InvalidSpec, PodCreationFailed,
# Conflict, handler errors) on the OmniService.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
