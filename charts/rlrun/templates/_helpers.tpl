{{/* Names and labels shared by every template. */}}
{{- define "rlrun.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rlrun.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "rlrun.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rlrun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "rlrun.labels" -}}
{{ include "rlrun.selectorLabels" . }}
app.kubernetes.io/part-of: rlrun
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "rlrun.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rlrun.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rlrun.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the key every run's credentials derive from (rlrun.operator.auth). */}}
{{- define "rlrun.tokenKeySecret" -}}
{{- default (printf "%s-token-key" (include "rlrun.fullname" .)) .Values.tokenKey.existingSecret -}}
{{- end -}}

{{/* Namespaces whose runs are scraped: the monitoring list, else the watched ones (empty: any). */}}
{{- define "rlrun.monitoredNamespaces" -}}
{{- if .Values.monitoring.namespaces -}}
{{- toJson .Values.monitoring.namespaces -}}
{{- else if not .Values.operator.watchAllNamespaces -}}
{{- toJson .Values.operator.watchNamespaces -}}
{{- else -}}
[]
{{- end -}}
{{- end -}}

{{/* The operator's permissions: least privilege, no wildcards (see services/operator/rbac.py). */}}
{{- define "rlrun.rules" -}}
- apiGroups: ["rlrun.dev"]
  resources: ["rlruns"]
  verbs: ["list", "watch", "patch", "delete"]
- apiGroups: ["rlrun.dev"]
  resources: ["rlruns/status"]
  verbs: ["patch"]
- apiGroups: ["rlrun.dev"]
  resources: ["rlruns/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["configmaps", "services", "persistentvolumeclaims"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["statefulsets", "deployments"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "list"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "delete"]
{{- end -}}

{{- /* Each run's generated Secret is written blind and deleted by name: no Secret is read. Granted
only in the namespaces runs may use (rlrun.runNamespaces), never cluster-wide. */}}
{{- define "rlrun.secretRules" -}}
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "patch", "delete"]
{{- end -}}

{{- /* The namespaces where RLRuns may run: the watched ones, or runNamespaces when every
namespace is watched. */}}
{{- define "rlrun.runNamespaces" -}}
{{- if .Values.operator.watchAllNamespaces -}}
{{- toJson .Values.operator.runNamespaces -}}
{{- else -}}
{{- toJson .Values.operator.watchNamespaces -}}
{{- end -}}
{{- end -}}
