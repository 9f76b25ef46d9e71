{{/* Names and labels shared by every object of the chart. */}}

{{- define "setu.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "setu.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: api, delivery, ingest, migrate. */}}
{{- define "setu.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "setu.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "setu.secretName" -}}
{{- .Values.existingSecret | default (include "setu.fullname" .) -}}
{{- end -}}

{{/* The ConfigMap's data: the configured settings (an empty value means "unset"). */}}
{{- define "setu.configData" -}}
{{- range $key, $value := .Values.config }}
{{- if ne (toString $value) "" }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The Secret's data: the configured credentials (an empty value means "unset"). */}}
{{- define "setu.secretData" -}}
{{- if and (not .Values.existingSecret) (not .Values.secrets.SETU_SECRET_KEY) }}
{{- fail "secrets.SETU_SECRET_KEY is required (make one with `setu secrets new-key`), or set existingSecret to a Secret that holds it" }}
{{- end }}
{{- range $key, $value := .Values.secrets }}
{{- if ne (toString $value) "" }}
{{ $key }}: {{ $value | toString | b64enc | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod-level settings every component shares. */}}
{{- define "setu.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* envFrom of a Setu container: the ConfigMap ("name") and the Secret. */}}
{{- define "setu.envFrom" -}}
envFrom:
  - configMapRef:
      name: {{ .configMap }}
  - secretRef:
      name: {{ .secret }}
{{- end -}}

{{/* Annotations that roll pods when their settings change. */}}
{{- define "setu.configChecksum" -}}
checksum/config: {{ include "setu.configData" . | sha256sum }}
checksum/secret: {{ include "setu.secretData" . | sha256sum }}
{{- end -}}

{{/*
The volumes of every Setu pod: /tmp (the root filesystem is read-only; Spark and the JVM write
their scratch files there) and tls.existingSecret (CA and client PEM files), when one is set.
*/}}
{{- define "setu.commonVolumes" -}}
- name: tmp
  emptyDir: {}
{{- with .Values.tls.existingSecret }}
- name: tls
  secret:
    secretName: {{ . }}
{{- end }}
{{- end -}}

{{/* Their mounts in a Setu container: /tmp, and the PEM files read-only at /etc/setu/tls. */}}
{{- define "setu.commonMounts" -}}
- {name: tmp, mountPath: /tmp}
{{- if .Values.tls.existingSecret }}
- {name: tls, mountPath: /etc/setu/tls, readOnly: true}
{{- end }}
{{- end -}}
