{{/* The release's full name, shortened to what Kubernetes names allow. */}}
{{- define "eureka-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "eureka-operator.serviceAccountName" -}}
{{- default (include "eureka-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "eureka-operator.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "eureka-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
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
