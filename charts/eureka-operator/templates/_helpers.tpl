{{/* The chart's name, or nameOverride: the app.kubernetes.io/name label and part of the full name. */}}
{{- define "eureka-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name, shortened to what Kubernetes names allow; fullnameOverride replaces it
(keeping a Java server's Service name, say). */}}
{{- define "eureka-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "eureka-operator.serviceAccountName" -}}
{{- default (include "eureka-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "eureka-operator.labels" -}}
app.kubernetes.io/name: {{ include "eureka-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "eureka-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "eureka-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "eureka-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The headless Service through which replicas find each other. */}}
{{- define "eureka-operator.peersService" -}}
{{- printf "%s-peers" (include "eureka-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "eureka-operator.basicAuthSecret" -}}
{{- default (printf "%s-basic-auth" (include "eureka-operator.fullname" .)) .Values.basicAuth.existingSecret -}}
{{- end -}}

{{/* The Secret holding the API's certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "eureka-operator.tlsSecret" -}}
{{- if .Values.tls.secretName -}}
{{- .Values.tls.secretName -}}
{{- else if .Values.tls.certManager.enabled -}}
{{- printf "%s-tls" (include "eureka-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- fail "tls.enabled needs tls.secretName or tls.certManager.enabled" -}}
{{- end -}}
{{- end -}}

{{/* The name replicas check each other's certificate against: the client Service's. */}}
{{- define "eureka-operator.tlsServerName" -}}
{{- printf "%s.%s.svc" (include "eureka-operator.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* The Service Prometheus scrapes (serviceMonitor.enabled): the admin port, kept off the client Service. */}}
{{- define "eureka-operator.metricsService" -}}
{{- printf "%s-metrics" (include "eureka-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The chart-created basic-auth Secret's data; the pod template carries its checksum, so a new
password rolls the pods (they read it from env at start). */}}
{{- define "eureka-operator.basicAuthData" -}}
username: {{ .Values.basicAuth.username | quote }}
password: {{ .Values.basicAuth.password | quote }}
{{- if .Values.basicAuth.peerCredentials }}
peer-username: {{ .Values.basicAuth.peerUsername | quote }}
peer-password: {{ .Values.basicAuth.peerPassword | quote }}
{{- end }}
{{- end -}}

{{/* The rules on what the operator watches: cluster-wide in the ClusterRole, or in a Role per
namespace of eureka.watchNamespaces. */}}
{{- define "eureka-operator.watchedRules" -}}
# Watch pods as compact projections; record REST status overrides as a pod annotation.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, patch]
# The readiness gate (EurekaApp readinessGate): its condition on pods.
- apiGroups: [""]
  resources: [pods/status]
  verbs: [patch]
# EurekaApps: watch; remove the finalizer an earlier version added.
- apiGroups: [eureka-operator.dev]
  resources: [eurekaapps]
  verbs: [list, watch, patch]
- apiGroups: [eureka-operator.dev]
  resources: [eurekaapps/status]
  verbs: [patch]
# Events on EurekaApps (created, then patched as series).
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}
