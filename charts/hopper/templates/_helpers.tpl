{{/*
Names and labels. Every helper here and in _sidecar.tpl takes a context dict,
so that a parent chart can call them with its own release and the hopper
values it holds:

  (dict "root" $ "values" .Values)          in this chart
  (dict "root" $ "values" .Values.hopper)   in a parent chart (dependency "hopper")
*/}}

{{- define "hopper.name" -}}
{{- default .root.Chart.Name .values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hopper.fullname" -}}
{{- if .values.fullnameOverride -}}
{{- .values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "hopper.name" . -}}
{{- if contains $name .root.Release.Name -}}
{{- .root.Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .root.Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of Hopper's ConfigMap: <fullname>-hopper, or <fullname> when that already ends in "hopper". */}}
{{- define "hopper.configMapName" -}}
{{- $full := include "hopper.fullname" . -}}
{{- if hasSuffix "hopper" $full -}}
{{- $full -}}
{{- else -}}
{{- printf "%s-hopper" ($full | trunc 56 | trimSuffix "-") -}}
{{- end -}}
{{- end -}}

{{- define "hopper.chart" -}}
{{- printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hopper.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hopper.name" . }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{- define "hopper.labels" -}}
helm.sh/chart: {{ include "hopper.chart" . }}
{{ include "hopper.selectorLabels" . }}
{{- with .root.Chart.AppVersion }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{/* image renders repository:tag, or repository@digest when a digest is set. Context: an image values map. */}}
{{- define "hopper.image" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository (toString .tag) -}}
{{- end -}}
{{- end -}}
