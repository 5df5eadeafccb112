{{/* The namespace every namespaced object of the chart goes to. */}}
{{- define "vfio-dra.namespace" -}}
{{ .Values.namespace.name }}
{{- end -}}
