{{/* Labels on every object; the selector uses the same two. */}}
{{- define "kubenpu.labels" -}}
app.kubernetes.io/name: kubenpu
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The agent's config.yaml: .Values.config with the TLS and auth file paths of the mounted
Secrets filled in (the keys are the agent's own, config/kubenpu.yaml). */}}
{{- define "kubenpu.config" -}}
{{- $config := deepCopy .Values.config }}
{{- if .Values.bccFallback }}
{{- $_ := set $config.probe "loader" "auto" }}
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
