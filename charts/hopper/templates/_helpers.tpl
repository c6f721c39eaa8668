{{/*
Names and labels. Every helper here and in _sidecar.tpl takes a context dict,
so that a parent chart can call them with its own release and the one hopper
values block it holds:

  (dict "values" .Values "context" $)          in this chart
  (dict "values" .Values.hopper "context" $)   in a parent chart (dependency "hopper")
*/}}

{{- define "hopper.name" -}}
{{- /* Not .Chart.Name: from a parent chart's context that is the parent's
       name, and the names the parent's includes compute must match the
       objects this chart renders for the same release. */ -}}
{{- default "hopper" .values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hopper.fullname" -}}
{{- if .values.fullnameOverride -}}
{{- .values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "hopper.name" . -}}
{{- if contains $name .context.Release.Name -}}
{{- .context.Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .context.Release.Name $name | trunc 63 | trimSuffix "-" -}}
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
{{- printf "%s-%s" .context.Chart.Name .context.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hopper.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hopper.name" . }}
app.kubernetes.io/instance: {{ .context.Release.Name }}
{{- end -}}

{{- define "hopper.labels" -}}
helm.sh/chart: {{ include "hopper.chart" . }}
{{ include "hopper.selectorLabels" . }}
{{- with .context.Chart.AppVersion }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .context.Release.Service }}
{{- end -}}

{{/*
hopper.image renders repository:tag, or repository@digest when a digest is
set. global.imageRegistry, when set, replaces the registry of the
repository (its first part when that holds a dot or a colon, or is
localhost, as Docker reads an image name) or is put in front of a
repository that names none, so that every image the chart renders comes
from one mirror. Context: dict "image" <an image values map> "values"
<the values holding global>.
*/}}
{{- define "hopper.image" -}}
{{- $img := .image -}}
{{- $repo := toString $img.repository -}}
{{- $reg := toString (default "" (get (default (dict) .values.global) "imageRegistry")) | trimSuffix "/" -}}
{{- if $reg -}}
{{- $parts := splitList "/" $repo -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repo = join "/" (rest $parts) -}}
{{- end -}}
{{- $repo = printf "%s/%s" $reg $repo -}}
{{- end -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $repo $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (toString $img.tag) -}}
{{- end -}}
{{- end -}}

{{/*
hopper.metricsSelector: labels of the pods that run Hopper, for the metrics
Service and the PodMonitor. This chart's pod labels by default; a parent
chart's pods carry the parent's labels, so with deployment.enabled false
metrics.selector must name them.
*/}}
{{- define "hopper.metricsSelector" -}}
{{- if .values.metrics.selector -}}
{{- toYaml .values.metrics.selector -}}
{{- else if .values.deployment.enabled -}}
{{- include "hopper.selectorLabels" . -}}
{{- else -}}
{{- fail "metrics.selector is required when deployment.enabled is false: the labels of your pods that run the Hopper sidecar" -}}
{{- end -}}
{{- end -}}

{{/* hopper.serviceAccountName: the pods' ServiceAccount ("" = the namespace's default). */}}
{{- define "hopper.serviceAccountName" -}}
{{- if .values.serviceAccount.create -}}
{{- default (include "hopper.fullname" .) .values.serviceAccount.name -}}
{{- else -}}
{{- .values.serviceAccount.name -}}
{{- end -}}
{{- end -}}
