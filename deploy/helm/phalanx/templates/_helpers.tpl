{{/* Name of cluster-scoped objects: the release name when it contains "phalanx", else
release-phalanx (so two releases in two namespaces do not collide). */}}
{{- define "phalanx.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object: (dict "root" $ "name" "phalanx-binder"); name is optional. */}}
{{- define "phalanx.labels" -}}
{{- with .name }}
app.kubernetes.io/name: {{ . }}
{{- end }}
app.kubernetes.io/part-of: phalanx
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* Labels of a pod template: stable across chart versions (no chart label). */}}
{{- define "phalanx.podLabels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: phalanx
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{/* Pod template annotations: a new credentials rotation restarts the pods. */}}
{{- define "phalanx.podAnnotations" -}}
{{- if .Values.credentials.generate }}
annotations:
  phalanx.io/rotation: {{ .Values.credentials.rotation | toString | quote }}
{{- end }}
{{- end -}}

{{- define "phalanx.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* image + pull policy lines of a Phalanx container */}}
{{- define "phalanx.containerImage" -}}
image: {{ include "phalanx.image" . }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{- define "phalanx.pullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "phalanx.natsUrl" -}}
tls://nats.{{ .Release.Namespace }}.svc:4222
{{- end -}}

{{/* The bus environment of a service: (dict "root" $ "service" "binder") */}}
{{- define "phalanx.natsEnv" -}}
- {name: PHALANX_NATS_URL, value: {{ include "phalanx.natsUrl" .root | quote }}}
- {name: PHALANX_NATS_CREDS, value: /etc/phalanx/nats/creds/{{ .service }}.creds}
- {name: PHALANX_NATS_CA, value: /etc/phalanx/nats/ca/ca.crt}
{{- end -}}

{{/* Startup, readiness and liveness probes on the health port. */}}
{{- define "phalanx.probes" -}}
ports:
- {name: health, containerPort: 8080}
startupProbe:
  httpGet: {path: /healthz, port: health}
  periodSeconds: 2
  failureThreshold: 60
readinessProbe:
  httpGet: {path: /readyz, port: health}
  periodSeconds: 5
livenessProbe:
  httpGet: {path: /healthz, port: health}
  periodSeconds: 10
  failureThreshold: 3
{{- end -}}

{{- define "phalanx.restrictedContainer" -}}
securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
{{- end -}}

{{- define "phalanx.nonRootPod" -}}
securityContext: {runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, seccompProfile: {type: RuntimeDefault}}
{{- end -}}

{{- define "phalanx.credsMounts" -}}
- {name: nats-creds, mountPath: /etc/phalanx/nats/creds, readOnly: true}
- {name: nats-ca, mountPath: /etc/phalanx/nats/ca, readOnly: true}
{{- end -}}

{{/* The credential and CA volumes of a cluster service: (dict "service" "binder") */}}
{{- define "phalanx.credsVolumes" -}}
- name: nats-creds
  secret: {secretName: phalanx-nats-{{ .service }}, items: [{key: creds, path: {{ .service }}.creds}]}
- name: nats-ca
  secret: {secretName: phalanx-nats-tls, items: [{key: ca.crt, path: ca.crt}]}
{{- end -}}

{{/* The DNS names of the nats certificate (the hook's `phalanx bus kube-secrets` makes the same). */}}
{{- define "phalanx.natsDnsNames" -}}
{{- $ns := .Release.Namespace -}}
{{- range $suffix := list (printf "%s.svc" $ns) (printf "%s.svc.%s" $ns $.Values.clusterDomain) }}
- nats.{{ $suffix }}
- "*.nats-headless.{{ $suffix }}"
{{- end }}
- nats
- nats.{{ $ns }}
{{- end -}}

{{/* nats.conf of every server (the ConfigMap nats-config; its checksum restarts the servers). */}}
{{- define "phalanx.natsConf" -}}
server_name: $POD_NAME
listen: "0.0.0.0:4222"
http: "0.0.0.0:8222"
jetstream {
  store_dir: /data
  max_file_store: {{ .Values.nats.storage.maxFileStore }}
}
tls {
  cert_file: /etc/nats/tls/tls.crt
  key_file: /etc/nats/tls/tls.key
  ca_file: /etc/nats/tls/ca.crt
  timeout: 5
}
cluster {
  name: phalanx
  listen: "0.0.0.0:6222"
  routes: [
{{- range $i := until (int .Values.nats.replicas) }}
    "tls://nats-{{ $i }}.nats-headless.{{ $.Release.Namespace }}.svc:6222"
{{- end }}
  ]
  tls {
    cert_file: /etc/nats/tls/tls.crt
    key_file: /etc/nats/tls/tls.key
    ca_file: /etc/nats/tls/ca.crt
    verify: true
    timeout: 5
  }
}
include "auth/auth.conf"
{{- end -}}

{{/* nodeSelector and tolerations of the cluster-wide pods (Deployments, nats, bus-init). */}}
{{- define "phalanx.clusterPodPlacement" -}}
{{- with .Values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations: {{- toYaml . | nindent 0 }}
{{- end }}
{{- end -}}
