{{- define "sovereignspec.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sovereignspec.fullname" -}}
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

{{- define "sovereignspec.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ include "sovereignspec.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "sovereignspec.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sovereignspec.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sovereignspec.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sovereignspec.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The dispatcher role serves its own controllerName and field manager unless they are set. */}}
{{- define "sovereignspec.controllerName" -}}
{{- if and (eq .Values.role "dispatcher") (eq .Values.controllerName "sovereignspec.io/speculation") -}}
sovereignspec.io/dispatcher
{{- else -}}
{{- .Values.controllerName -}}
{{- end -}}
{{- end -}}

{{- define "sovereignspec.fieldManager" -}}
{{- if and (eq .Values.role "dispatcher") (eq .Values.fieldManager "sovereignspec-controller") -}}
sovereignspec-dispatcher
{{- else -}}
{{- .Values.fieldManager -}}
{{- end -}}
{{- end -}}

{{/* The leader-election Lease: one per release (the release's name, so two releases never share one). */}}
{{- define "sovereignspec.leaseName" -}}
{{- include "sovereignspec.fullname" . -}}
{{- end -}}

{{/* The Secret holding the metrics certificate (tls.crt, tls.key, ca.crt): the one named in
metrics.certSecret (cert-manager's), else the chart's own (templates/metrics-cert.yaml). */}}
{{- define "sovereignspec.metricsCertSecret" -}}
{{- .Values.metrics.certSecret | default (printf "%s-metrics-cert" (include "sovereignspec.fullname" .)) -}}
{{- end -}}
