{{/* Names and labels shared by every template. */}}

{{- define "tuna.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release name, so that objects are named tuna-operator-controller etc. */}}
{{- define "tuna.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if .Values.nameOverride -}}
{{- printf "%s-%s" .Release.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* "<fullname>-<component>", e.g. tuna-operator-controller. */}}
{{- define "tuna.componentName" -}}
{{- printf "%s-%s" (include "tuna.fullname" .root | trunc 52 | trimSuffix "-") .component -}}
{{- end -}}

{{- define "tuna.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "tuna.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of a component: {root, component}. */}}
{{- define "tuna.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tuna.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tuna.componentLabels" -}}
{{ include "tuna.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tuna.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Secret holding the API key, or "" when extraEnv provides it. */}}
{{- define "tuna.credentialsSecret" -}}
{{- if .Values.credentials.existingSecret -}}
{{- .Values.credentials.existingSecret -}}
{{- else if .Values.credentials.apiKey -}}
{{- printf "%s-credentials" (include "tuna.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The ConfigMap holding the edge's CA, or "". */}}
{{- define "tuna.caConfigMap" -}}
{{- if .Values.edge.ca.pem -}}
{{- printf "%s-edge-ca" (include "tuna.fullname" .) -}}
{{- else if .Values.edge.ca.existingConfigMap -}}
{{- .Values.edge.ca.existingConfigMap -}}
{{- end -}}
{{- end -}}

{{/*
Checks the value combinations the schema cannot express; every failure says
what to set. Included by both Deployments, so `helm template` fails too.
*/}}
{{- define "tuna.validate" -}}
{{- $fromEnv := false -}}
{{- range .Values.extraEnv -}}
{{- if eq .name "TUNA_API_KEY" -}}{{- $fromEnv = true -}}{{- end -}}
{{- end -}}
{{- $ways := 0 -}}
{{- if .Values.credentials.apiKey -}}{{- $ways = add1 $ways -}}{{- end -}}
{{- if .Values.credentials.existingSecret -}}{{- $ways = add1 $ways -}}{{- end -}}
{{- if $fromEnv -}}{{- $ways = add1 $ways -}}{{- end -}}
{{- if eq $ways 0 -}}
{{- fail "\n\nNo Tuna API key: set credentials.apiKey=<key> (the chart creates a Secret), credentials.existingSecret=<name of a Secret with the key api-key>, or an extraEnv entry named TUNA_API_KEY (from a secret injector)." -}}
{{- end -}}
{{- if gt $ways 1 -}}
{{- fail "\n\nThe Tuna API key is given more than once: set only one of credentials.apiKey, credentials.existingSecret and an extraEnv entry named TUNA_API_KEY." -}}
{{- end -}}
{{- if not .Values.edge.apiUrl -}}
{{- fail "\n\nedge.apiUrl is empty: set it to the edge's REST API, e.g. https://api.tuna.am." -}}
{{- end -}}
{{- if not .Values.edge.agentAddress -}}
{{- fail "\n\nedge.agentAddress is empty: set it to the edge's agent listener as host:port." -}}
{{- end -}}
{{- if and (gt (int .Values.controller.replicas) 1) (not .Values.controller.leaderElection.enabled) -}}
{{- fail "\n\ncontroller.replicas > 1 needs controller.leaderElection.enabled=true: without a leader every replica would reconcile." -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.service.enabled) -}}
{{- fail "\n\nmetrics.serviceMonitor.enabled=true needs metrics.service.enabled=true: a ServiceMonitor scrapes a Service." -}}
{{- end -}}
{{- end -}}

{{/* The environment both components share: {root, component}. */}}
{{- define "tuna.env" -}}
- name: RUST_LOG
  value: {{ .root.Values.logging.level | quote }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- if has .component (list "controller" "agent") }}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}
{{- $secret := include "tuna.credentialsSecret" .root }}
{{- if $secret }}
- name: TUNA_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: api-key
{{- end }}
{{- with .root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The edge flags both components share. */}}
{{- define "tuna.edgeArgs" -}}
- --edge-api={{ .Values.edge.apiUrl }}
{{- if include "tuna.caConfigMap" . }}
- --edge-ca-file=/etc/tuna/edge-ca/{{ .Values.edge.ca.key }}
{{- end }}
{{- end -}}

{{/* Pod annotations: checksums that restart pods when what they read changes. */}}
{{- define "tuna.podAnnotations" -}}
checksum/credentials: {{ printf "%s/%s" (include "tuna.credentialsSecret" .root) (include (print .root.Template.BasePath "/credentials-secret.yaml") .root) | sha256sum }}
checksum/edge-ca: {{ printf "%s/%s" (include "tuna.caConfigMap" .root) (include (print .root.Template.BasePath "/edge-ca-configmap.yaml") .root) | sha256sum }}
checksum/rbac: {{ include (print .root.Template.BasePath "/" .component "/rbac.yaml") .root | sha256sum }}
{{- with .root.Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- with .values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The parts of a pod spec both components share: {root, values}. */}}
{{- define "tuna.podCommon" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if include "tuna.caConfigMap" .root }}
volumes:
  - name: edge-ca
    configMap:
      name: {{ include "tuna.caConfigMap" .root }}
{{- end }}
{{- end -}}

{{/* Container fields both components share: {root, values}. */}}
{{- define "tuna.containerCommon" -}}
image: {{ include "tuna.image" .root }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
ports:
  - name: metrics
    containerPort: {{ .root.Values.metrics.port }}
    protocol: TCP
  - name: probes
    containerPort: {{ .root.Values.probePort }}
    protocol: TCP
livenessProbe:
  httpGet:
    path: /healthz
    port: probes
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: probes
  periodSeconds: 5
  failureThreshold: 2
startupProbe:
  httpGet:
    path: /healthz
    port: probes
  periodSeconds: 2
  failureThreshold: 30
resources:
  {{- toYaml .values.resources | nindent 2 }}
securityContext:
  {{- toYaml .root.Values.securityContext | nindent 2 }}
{{- if include "tuna.caConfigMap" .root }}
volumeMounts:
  - name: edge-ca
    mountPath: /etc/tuna/edge-ca
    readOnly: true
{{- end }}
{{- end -}}

{{/* The Secret holding the connector proxy's CA. */}}
{{- define "tuna.connectorsCaSecret" -}}
{{- default (printf "%s-connectors-ca" (include "tuna.fullname" .)) .Values.connectors.caSecretName -}}
{{- end -}}

{{/* The node directory of the CSI plugin's socket. */}}
{{- define "tuna.csiPluginDir" -}}
{{- default (printf "%s/plugins/connectors-csi" .Values.connectors.csi.kubeletDir) .Values.connectors.csi.pluginDir -}}
{{- end -}}

{{/* kubelet's plugin registration directory. */}}
{{- define "tuna.csiRegistrationDir" -}}
{{- default (printf "%s/plugins_registry" .Values.connectors.csi.kubeletDir) .Values.connectors.csi.registrationDir -}}
{{- end -}}
