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

{{/* A webhook of a CompositeController: its shard's hook Service (name) at path. */}}
{{- define "etcdops.webhook" -}}
service:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  port: 80
  protocol: http
path: {{ .path }}
timeout: 10s
{{- end }}

{{/*
A shard's names, from its number: shard 0 keeps the single-shard names (etcdops, etcdops-hook),
so that Metacontroller's finalizer on every existing EtcdCluster,
metacontroller.io/compositecontroller-etcdops, stays its controller's when shards are added.
*/}}
{{- define "etcdops.controllerName" -}}
etcdops{{ if . }}-shard-{{ . }}{{ end }}
{{- end }}
{{- define "etcdops.hookName" -}}
etcdops-hook{{ if . }}-shard-{{ . }}{{ end }}
{{- end }}

{{/* The shard numbers other than 0, as strings: what shard 0's selector leaves out. */}}
{{- define "etcdops.otherShards" -}}
{{- range $k := untilStep 1 (int .Values.shards) 1 }}
- {{ $k | quote }}
{{- end }}
{{- end }}
