{{/*
The operator's RBAC rules, in two sets:

- "horizonserve.rbac.clusterScopedRules": objects that exist only at cluster scope (nodes,
  CRDs; namespaces in namespaced mode). Always granted by a ClusterRole.
- "horizonserve.rbac.namespacedRules": objects that live in namespaces (OmniServices, serving
  pods and their RBAC, events). Granted by the same ClusterRole in cluster-wide mode, or by a
  Role in operator.watchNamespace in namespaced mode.

Least privilege: no wildcards, no `update` where a `patch` does, no `deletecollection`, no
secrets, no `bind`/`escalate`. The Role the operator creates for serving pods holds only
`pods get, patch`, which the operator holds itself at the same scope, so the API server's
escalation check lets it create that Role and its RoleBinding without `escalate`/`bind`.
*/}}

{{- define "horizonserve.rbac.clusterScopedRules" -}}
# kopf discovery: the operator looks up the OmniService CRD before it starts watching, and
# notices when the CRD is installed, upgraded or removed while it runs.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
# GPU node index (kopf.index): one serving pod per node that matches an OmniService's node
# selector and offers an nvidia.com/gpu; read-only, the operator never changes nodes.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
{{- if .Values.operator.watchNamespace }}
# Namespaced mode only: kopf lists and watches namespaces to resolve the namespace it serves
# (and notices it being created or deleted); without this it retries for about a minute at
# every start before falling back. In cluster-wide mode kopf never reads namespaces.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get", "list", "watch"]
{{- end }}
{{- end }}

{{- define "horizonserve.rbac.namespacedRules" -}}
# The custom resource itself: watch OmniServices, and patch them for kopf's finalizer and its
# last-handled-configuration annotation. The operator never creates or deletes them.
- apiGroups: ["horizonserve.io"]
  resources: ["omniservices"]
  verbs: ["get", "list", "watch", "patch"]
# OmniService status (status subresource): observedGeneration, conditions, nodes ready /
# desired, attainment and per-node summaries; kopf's handler progress is stored here as well.
- apiGroups: ["horizonserve.io"]
  resources: ["omniservices/status"]
  verbs: ["get", "patch", "update"]
# Serving pods: one per matching GPU node, owned by the OmniService (garbage collected with
# it). create/delete to follow nodes coming and going, patch to adopt and relabel, watch to
# read the sidecar's summary annotation for the status. `get, patch` are also what the operator
# grants to the serving pods' own Role (below), and it must hold them to grant them.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# The serving pods' identity: a ServiceAccount per OmniService (owned by it, removed with it).
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# ... bound by a RoleBinding to a Role that lets the sidecar read and patch its own pod (the
# per-node summary annotation the operator aggregates into the status). Both owned by the
# OmniService. Granting them needs no `escalate`/`bind`: see the pods rule above.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# kopf reports handler progress and errors as Kubernetes events on the OmniService.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
