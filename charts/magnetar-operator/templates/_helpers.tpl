{{/* Chart name, overridable with nameOverride. */}}
{{- define "magnetar-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: release-scoped and at most 63 characters (the DNS label limit for names and label
values). A release already named after the chart is not repeated ("magnetar-operator", not
"magnetar-operator-magnetar-operator").
*/}}
{{- define "magnetar-operator.fullname" -}}
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

{{- define "magnetar-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: must never change across upgrades (Deployment selectors are immutable). */}}
{{- define "magnetar-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "magnetar-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "magnetar-operator.labels" -}}
helm.sh/chart: {{ include "magnetar-operator.chart" . }}
{{ include "magnetar-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: magnetar
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "magnetar-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "magnetar-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "magnetar-operator.peeringName" -}}
{{- default (include "magnetar-operator.fullname" .) .Values.peering.name }}
{{- end }}

{{- define "magnetar-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* True (non-empty) when the operator watches every namespace. */}}
{{- define "magnetar-operator.clusterWide" -}}
{{- if not .Values.watchNamespaces }}true{{- end }}
{{- end }}

{{/*
RBAC rules for the Magnetar resources, shared by the ClusterRole (all namespaces) and the
per-namespace Roles. The operator never writes spec: it reads the objects, patches metadata
(kopf's finalizers and its progress annotations) and the status subresource.
*/}}
{{- define "magnetar-operator.resourceRules" -}}
- apiGroups: ["magnetar.io"]
  resources: ["magnetarclusters", "tenants", "topicnamespaces", "topics", "retentionpolicies"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["magnetar.io"]
  resources: ["magnetarclusters/status", "tenants/status", "topicnamespaces/status", "topics/status",
              "retentionpolicies/status"]
  verbs: ["get", "patch"]
# What a MagnetarCluster becomes: the operator reads, creates and patches these objects (never
# replaces or deletes them: they carry ownerReferences and Kubernetes' garbage collector removes
# them with the cluster).
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "create"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors"]
  verbs: ["get", "create", "patch"]
# Rolling updates: list a component's pods (readiness, template hash) and delete one outdated pod
# at a time (the StatefulSet recreates it).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "delete"]
# Events make errors visible with `kubectl describe`, not only in the operator's log. kopf posts
# core/v1 Events; newer tooling reads events.k8s.io, which is the same object behind both APIs.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- if .Values.rbac.readSecrets }}
- apiGroups: [""]
  resources: ["secrets"]
  {{- with .Values.rbac.secretNames }}
  resourceNames: {{ toJson . }}
  {{- end }}
  {{- if include "magnetar-operator.watchSecrets" . }}
  # Watched: a rotated credentials Secret is used at once (rbac.watchSecrets).
  verbs: ["get", "list", "watch"]
  {{- else }}
  verbs: ["get"]
  {{- end }}
{{- end }}
{{- end }}

{{/*
Whether the operator watches credentials Secrets: asked for, readable, and not limited by name (a watch
of the collection cannot be restricted to resourceNames).
*/}}
{{- define "magnetar-operator.watchSecrets" -}}
{{- if and .Values.rbac.watchSecrets .Values.rbac.readSecrets (not .Values.rbac.secretNames) }}true{{- end }}
{{- end }}
