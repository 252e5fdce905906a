{{/* The chart's name, and the release's full name (at most 63 characters, a DNS label). */}}
{{- define "cronoq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cronoq.fullname" -}}
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

{{- define "cronoq.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "cronoq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "cronoq.serverSelector" -}}
app.kubernetes.io/name: {{ include "cronoq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end }}

{{- define "cronoq.workerSelector" -}}
app.kubernetes.io/name: {{ include "cronoq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: worker
{{- end }}

{{- define "cronoq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cronoq.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "cronoq.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "cronoq.workerImage" -}}
{{- if not .Values.worker.image.repository }}
{{- fail "worker.enabled needs worker.image.repository: an image with your application's modules (FROM the cronoq image)" }}
{{- end }}
{{- printf "%s:%s" .Values.worker.image.repository (default .Chart.AppVersion .Values.worker.image.tag) }}
{{- end }}

{{/* PostgreSQL when a URL or a Secret holding one is given; SQLite otherwise. */}}
{{- define "cronoq.postgres" -}}
{{- if or .Values.store.postgres.url .Values.store.postgres.existingSecret }}true{{ end }}
{{- end }}

{{- define "cronoq.tokensSecret" -}}
{{- default (printf "%s-tokens" (include "cronoq.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{- define "cronoq.postgresSecret" -}}
{{- default (printf "%s-postgres" (include "cronoq.fullname" .)) .Values.store.postgres.existingSecret }}
{{- end }}

{{/* The gRPC address the workers dial: the server Service. */}}
{{- define "cronoq.target" -}}
{{- printf "http://%s.%s.svc:%d" (include "cronoq.fullname" .) .Release.Namespace (int .Values.server.ports.grpc) }}
{{- end }}

{{/*
A value written as TOML: strings quoted, whole numbers as integers (Helm reads every YAML
number as a float, and a count such as max = 8.0 is refused), lists and inline tables.
*/}}
{{- define "cronoq.toml.value" -}}
{{- $v := . -}}
{{- if kindIs "string" $v -}}
{{- toJson $v -}}
{{- else if kindIs "bool" $v -}}
{{- $v -}}
{{- else if or (kindIs "float64" $v) (kindIs "float32" $v) -}}
{{- if eq (float64 (int64 $v)) (float64 $v) -}}{{ int64 $v }}{{- else -}}{{ $v }}{{- end -}}
{{- else if or (kindIs "int" $v) (kindIs "int64" $v) (kindIs "int32" $v) (kindIs "uint64" $v) -}}
{{- $v -}}
{{- else if kindIs "slice" $v -}}
[{{ range $i, $e := $v }}{{ if $i }}, {{ end }}{{ include "cronoq.toml.value" $e }}{{ end }}]
{{- else if kindIs "map" $v -}}
{ {{- range $i, $k := keys $v | sortAlpha }}{{ if $i }},{{ end }} {{ toJson $k }} = {{ include "cronoq.toml.value" (get $v $k) }}{{ end }} }
{{- else -}}
{{- fail (printf "cannot write %v (%s) as TOML" $v (kindOf $v)) -}}
{{- end -}}
{{- end }}

{{/* server.toml (docs/configuration.md). */}}
{{- define "cronoq.serverToml" -}}
# cronoq-server's configuration, rendered by the cronoq Helm chart.
[server]
grpc_addr = "0.0.0.0:{{ int .Values.server.ports.grpc }}"
http_addr = "0.0.0.0:{{ int .Values.server.ports.http }}"
metrics_addr = "0.0.0.0:{{ int .Values.server.ports.metrics }}"
shutdown_grace_s = {{ include "cronoq.toml.value" .Values.server.shutdownGraceSeconds }}
log_level = {{ toJson .Values.server.logLevel }}
dashboard = {{ .Values.server.dashboard }}

[store]
{{- if include "cronoq.postgres" . }}
kind = "postgres"
url_env = "DATABASE_URL"
schema = {{ toJson .Values.store.postgres.schema }}
{{- else }}
kind = "sqlite"
path = {{ toJson .Values.store.sqlite.path }}
{{- end }}
{{- with .Values.config.limits }}

[limits]
{{- range $k, $v := . }}
{{ $k }} = {{ include "cronoq.toml.value" $v }}
{{- end }}
{{- end }}

[[auth.tokens]]
token_env = "CRONOQ_CLIENT_TOKEN"
role = "client"

[[auth.tokens]]
token_env = "CRONOQ_WORKER_TOKEN"
role = "worker"

[[auth.tokens]]
token_env = "CRONOQ_ADMIN_TOKEN"
role = "admin"
{{- range .Values.config.pools }}

[[pools]]
name = {{ toJson (required "config.pools: every pool needs a name" .name) }}
{{- range $k, $v := omit . "name" }}
{{ $k }} = {{ include "cronoq.toml.value" $v }}
{{- end }}
{{- end }}
{{- with .Values.config.extraToml }}

{{ . }}
{{- end }}
{{- end }}

{{/* The server container's environment: the tokens and, with PostgreSQL, the URL. */}}
{{- define "cronoq.serverEnv" -}}
- name: CRONOQ_CLIENT_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "cronoq.tokensSecret" . }}
      key: client-token
- name: CRONOQ_WORKER_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "cronoq.tokensSecret" . }}
      key: worker-token
- name: CRONOQ_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "cronoq.tokensSecret" . }}
      key: admin-token
{{- if include "cronoq.postgres" . }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "cronoq.postgresSecret" . }}
      key: {{ .Values.store.postgres.existingSecretKey | default "url" }}
{{- end }}
{{- with .Values.server.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The server's pod template, shared by the StatefulSet (SQLite) and the Deployment. */}}
{{- define "cronoq.serverPod" -}}
metadata:
  labels:
    {{- include "cronoq.labels" . | nindent 4 }}
    app.kubernetes.io/component: server
  annotations:
    checksum/config: {{ include "cronoq.serverToml" . | sha256sum }}
    {{- with .Values.server.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "cronoq.serviceAccountName" . }}
  automountServiceAccountToken: false
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  # SIGTERM drains: server.shutdown_grace_s, then up to 5 s for open calls.
  terminationGracePeriodSeconds: {{ add (int .Values.server.shutdownGraceSeconds) 15 }}
  containers:
    - name: server
      image: {{ include "cronoq.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      command: ["cronoq-server", "-c", "/etc/cronoq/server.toml"]
      env:
        {{- include "cronoq.serverEnv" . | nindent 8 }}
      ports:
        - name: grpc
          containerPort: {{ int .Values.server.ports.grpc }}
          protocol: TCP
        - name: http
          containerPort: {{ int .Values.server.ports.http }}
          protocol: TCP
        - name: metrics
          containerPort: {{ int .Values.server.ports.metrics }}
          protocol: TCP
      # /healthz answers 200 while the process serves, leader or standby; /readyz only on the
      # leader, so the Service sends calls to the leader alone.
      livenessProbe:
        httpGet:
          path: /healthz
          port: http
        periodSeconds: 10
        timeoutSeconds: 3
        failureThreshold: 3
      readinessProbe:
        httpGet:
          path: /readyz
          port: http
        periodSeconds: 2
        timeoutSeconds: 2
        failureThreshold: 2
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      {{- with .Values.server.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - name: config
          mountPath: /etc/cronoq
          readOnly: true
        - name: tmp
          mountPath: /tmp
        {{- if not (include "cronoq.postgres" .) }}
        - name: data
          mountPath: {{ dir .Values.store.sqlite.path }}
        {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "cronoq.fullname" . }}-config
    - name: tmp
      emptyDir: {}
  {{- with .Values.server.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.server.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.server.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
