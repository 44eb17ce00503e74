{{/* Labels on every object: the kustomization's part-of, and Helm's own. */}}
{{- define "etcdops.labels" -}}
app.kubernetes.io/part-of: etcdops
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The one image of the hook, member Jobs and etcd pods' launcher. */}}
{{- define "etcdops.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* A webhook of the CompositeController: the hook's Service at path. */}}
{{- define "etcdops.webhook" -}}
service:
  name: etcdops-hook
  namespace: {{ .root.Release.Namespace }}
  port: 80
  protocol: http
path: {{ .path }}
timeout: 10s
{{- end }}
