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
