{{/* The namespace every namespaced object of the chart goes to. */}}
{{- define "vfio-dra.namespace" -}}
{{ .Values.namespace.name }}
{{- end -}}

{{/* The capabilities the enabled features add, as a flow list ([] for the default install). */}}
{{- define "vfio-dra.capabilities" -}}
{{- $caps := list -}}
{{- if .Values.sriovNetwork.enabled }}{{ $caps = append $caps "NET_ADMIN" }}{{ end -}}
{{- if .Values.deviceHolders.enabled }}{{ $caps = append $caps "SYS_PTRACE" }}{{ end -}}
{{ toJson $caps }}
{{- end -}}
