{{/*
Names and labels, in the prometheus-community style.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "rankscope.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The fully qualified app name, truncated to 63 characters (a DNS label). The release name
is used alone when it already contains the chart name.
*/}}
{{- define "rankscope.fullname" -}}
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

{{/* Chart name and version, for the helm.sh/chart label. */}}
{{- define "rankscope.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The namespace everything goes to, unless a monitor names its own. */}}
{{- define "rankscope.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "rankscope.labels" -}}
helm.sh/chart: {{ include "rankscope.chart" . }}
{{ include "rankscope.selectorLabels" . }}
app.kubernetes.io/version: {{ include "rankscope.imageTag" . | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rankscope
app.kubernetes.io/component: metrics
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that select the daemon's pods; never change them across upgrades. */}}
{{- define "rankscope.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rankscope.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The service account the daemon runs as. */}}
{{- define "rankscope.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rankscope.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image tag: image.tag, else the chart's appVersion (the package version). */}}
{{- define "rankscope.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/* The image reference; a digest wins over the tag. */}}
{{- define "rankscope.image" -}}
{{- $repository := .Values.image.repository }}
{{- if .Values.image.registry }}
{{- $repository = printf "%s/%s" .Values.image.registry .Values.image.repository }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (include "rankscope.imageTag" .) }}
{{- end }}
{{- end }}

{{/* http or https, from the web config. */}}
{{- define "rankscope.scheme" -}}
{{- if .Values.webConfig.tls.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{/* The Secret holding the web config file, or nothing when the daemon serves plain HTTP. */}}
{{- define "rankscope.webConfigSecretName" -}}
{{- if .Values.webConfig.existingSecret }}
{{- .Values.webConfig.existingSecret }}
{{- else if or .Values.webConfig.tls.enabled .Values.webConfig.basicAuthUsers }}
{{- printf "%s-web-config" (include "rankscope.fullname" .) }}
{{- end }}
{{- end }}

{{/* Whether the Service is rendered: on request, or because the ServiceMonitor needs it. */}}
{{- define "rankscope.serviceEnabled" -}}
{{- if or .Values.service.enabled .Values.serviceMonitor.enabled }}true{{ end }}
{{- end }}

{{/* The key of the web config file in that Secret. */}}
{{- define "rankscope.webConfigKey" -}}
{{- if .Values.webConfig.existingSecret }}
{{- .Values.webConfig.existingSecretKey }}
{{- else }}
{{- "web-config.yml" }}
{{- end }}
{{- end }}

{{/*
The scrape settings a ServiceMonitor endpoint and a PodMonitor podMetricsEndpoint share.
Called with (dict "monitor" .Values.serviceMonitor "root" $).
*/}}
{{- define "rankscope.scrapeEndpoint" -}}
{{- $monitor := .monitor -}}
path: /metrics
scheme: {{ include "rankscope.scheme" .root }}
{{- with $monitor.interval }}
interval: {{ . }}
{{- end }}
{{- with $monitor.scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
honorLabels: {{ $monitor.honorLabels }}
{{- with $monitor.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $monitor.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $monitor.relabelings }}
relabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $monitor.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A size as the daemon reads it: a string as is, a number as an integer byte count
(never 2.147483648e+09, which is how a template prints a large YAML number). */}}
{{- define "rankscope.size" -}}
{{- if kindIs "string" . }}{{ . }}{{ else }}{{ . | int64 }}{{ end }}
{{- end }}

{{/* A map as "k1=v1, k2=v2", for NOTES.txt. */}}
{{- define "rankscope.labelList" -}}
{{- $pairs := list }}
{{- range $key, $value := . }}
{{- $pairs = append $pairs (printf "%s=%v" $key $value) }}
{{- end }}
{{- join ", " $pairs }}
{{- end }}

{{/* A number of the rules' config as PromQL reads it: a whole number as digits (a template
prints 1073741824 from values as 1.073741824e+09), any other value as it is. */}}
{{- define "rankscope.ruleNumber" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- end }}
