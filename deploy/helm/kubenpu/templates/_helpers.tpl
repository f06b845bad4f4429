{{/* The chart's name, or nameOverride. */}}
{{- define "kubenpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object names: fullnameOverride, else the release's name when it contains the chart's name
(a release called kubenpu names its objects kubenpu), else <release>-<name>. */}}
{{- define "kubenpu.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "kubenpu.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kubenpu.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{/* The selector: fixed for the life of a release (a DaemonSet's selector cannot change). */}}
{{- define "kubenpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubenpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels on every object. part-of stays "kubenpu" whatever the names: the ServiceMonitor
makes it the job label, which the alerts select on. */}}
{{- define "kubenpu.labels" -}}
{{ include "kubenpu.selectorLabels" . }}
app.kubernetes.io/part-of: kubenpu
{{- end }}

{{/* The agent's config.yaml: .Values.config with the TLS and auth file paths of the mounted
Secrets filled in (the keys are the agent's own, config/kubenpu.yaml). */}}
{{- define "kubenpu.config" -}}
{{- $config := deepCopy .Values.config }}
{{- if .Values.bccFallback }}
{{- $_ := set $config.probe "loader" "auto" }}
{{- end }}
{{- /* The guard's keys only when a mode is on: off, the agent's own default, renders as before. */}}
{{- if and (eq $config.guard.mode "off") (not $config.guard.namespaces) }}
{{- $_ := unset $config "guard" }}
{{- else if not $config.attribution.pod_resources.enabled }}
{{- fail "config.guard: a mode other than off needs config.attribution.pod_resources.enabled (the allocations the policy is made of)" }}
{{- end }}
{{- $prom := $config.export.prometheus }}
{{- if .Values.metricsTLS.secretName }}
{{- $_ := set $prom "tls" (dict "cert_file" "/etc/kubenpu/tls/tls.crt" "key_file" "/etc/kubenpu/tls/tls.key") }}
{{- end }}
{{- with .Values.metricsAuth }}
{{- if .secretName }}
{{- $auth := $prom.auth }}
{{- if .username }}
{{- $_ := set $auth "username" .username }}
{{- $_ := set $auth "password_file" "/etc/kubenpu/auth/password" }}
{{- end }}
{{- if .bearerToken }}
{{- $_ := set $auth "bearer_token_file" "/etc/kubenpu/auth/token" }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/* The agent's image: by digest when one is given. */}}
{{- define "kubenpu.image" -}}
{{- with .Values.image -}}
{{ .repository }}:{{ .tag }}{{ if $.Values.bccFallback }}-bcc{{ end }}{{ if .digest }}@{{ .digest }}{{ end }}
{{- end }}
{{- end }}

{{/* Where the agent's pods run: the uninstall hook's pods run on the same nodes. */}}
{{- define "kubenpu.placement" -}}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $nodeSelector := .Values.nodeSelector | default dict }}
{{- if .Values.accel.required }}
{{- $nodeSelector = merge (dict "kubenpu.io/accel" "true") $nodeSelector }}
{{- end }}
{{- with $nodeSelector }}
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
{{- with .Values.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- end }}

{{- define "kubenpu.hookResources" -}}
requests: {cpu: 10m, memory: 32Mi}
limits: {memory: 128Mi}
{{- end }}

{{/* The uninstall DaemonSet's containers: root (the pins are root's files in bpffs), no
capability, nothing writable but bpffs. */}}
{{- define "kubenpu.hookContainer" -}}
resources:
  {{- include "kubenpu.hookResources" . | nindent 2 }}
securityContext:
  privileged: false
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsUser: 0
  runAsNonRoot: false
  capabilities:
    drop: [ALL]
  seccompProfile:
    {{- toYaml .Values.seccompProfile | nindent 4 }}
{{- end }}
