{{/*
Names, labels and images used by every template. Names are truncated to 63 characters (the
DNS label limit of Kubernetes names and label values).
*/}}

{{/*
Chart name, or nameOverride.
*/}}
{{- define "horizonserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the operator's objects: fullnameOverride, else <release>-<name>, else <release>
when the release name already contains the chart name (`helm install horizonserve ...`).
*/}}
{{- define "horizonserve.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "horizonserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object of the chart (app.kubernetes.io/* recommended labels), without the
component label.
*/}}
{{- define "horizonserve.commonLabels" -}}
helm.sh/chart: {{ include "horizonserve.chart" . }}
app.kubernetes.io/name: {{ include "horizonserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: horizonserve
{{- end }}

{{/*
Labels of the operator's objects (Deployment, ServiceAccount, RBAC).
*/}}
{{- define "horizonserve.labels" -}}
{{ include "horizonserve.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
Labels of the monitoring objects (ServiceMonitor, PodMonitor, metrics Service).
*/}}
{{- define "horizonserve.metricsLabels" -}}
{{ include "horizonserve.commonLabels" . }}
app.kubernetes.io/component: metrics
{{- end }}

{{/*
Selector labels of the operator pod (immutable in a Deployment: never add to these).
*/}}
{{- define "horizonserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "horizonserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
Name of the operator's ServiceAccount.
*/}}
{{- define "horizonserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "horizonserve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Operator image reference; the tag defaults to the chart's appVersion.
*/}}
{{- define "horizonserve.operatorImage" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
Serving image reference handed to the operator (HORIZONSERVE_SERVING_IMAGE).
*/}}
{{- define "horizonserve.servingImage" -}}
{{- printf "%s:%s" .Values.servingImage.repository (default .Chart.AppVersion .Values.servingImage.tag) }}
{{- end }}

{{/*
Namespace the operator watches: "" means all namespaces (cluster-wide mode).
*/}}
{{- define "horizonserve.watchNamespace" -}}
{{- .Values.operator.watchNamespace | default "" }}
{{- end }}

{{/*
Namespace for objects that must sit beside the serving pods (the ServiceMonitor's Service):
the watched namespace in namespaced mode, else the release namespace.
*/}}
{{- define "horizonserve.servingNamespace" -}}
{{- default .Release.Namespace .Values.operator.watchNamespace }}
{{- end }}

{{/*
Name of the cluster-scoped objects (ClusterRole, ClusterRoleBinding). It carries the release
namespace, so several namespaced installs with the same release name do not collide.
*/}}
{{- define "horizonserve.clusterObjectName" -}}
{{- printf "%s-%s" (include "horizonserve.fullname" .) .Release.Namespace }}
{{- end }}

{{/*
metrics.servingPodSelector as a kubectl label selector: k1=v1,k2=v2 (keys sorted).
*/}}
{{- define "horizonserve.servingPodSelectorString" -}}
{{- $parts := list }}
{{- range $k, $v := .Values.metrics.servingPodSelector }}
{{- $parts = append $parts (printf "%s=%s" $k $v) }}
{{- end }}
{{- join "," $parts }}
{{- end }}
