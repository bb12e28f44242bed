{{/* Names, labels and small computed values shared by every template. */}}

{{- define "hami-dra.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hami-dra.fullname" -}}
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

{{- define "hami-dra.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels; pass (dict "root" $ "component" "controller"). */}}
{{- define "hami-dra.labels" -}}
helm.sh/chart: {{ include "hami-dra.chart" .root }}
{{ include "hami-dra.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: hami-dra
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "hami-dra.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hami-dra.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{- define "hami-dra.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Component object names: <fullname>-<component>, kept within 63 characters. */}}
{{- define "hami-dra.componentName" -}}
{{- printf "%s-%s" (include "hami-dra.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hami-dra.serviceAccountName" -}}
{{- $override := get .root.Values.serviceAccounts .key }}
{{- default (include "hami-dra.componentName" (dict "root" .root "component" .component)) $override }}
{{- end }}

{{- define "hami-dra.pluginServiceAccount" -}}
{{- include "hami-dra.serviceAccountName" (dict "root" . "key" "kubeletPlugin" "component" "kubelet-plugin") }}
{{- end }}
{{- define "hami-dra.controllerServiceAccount" -}}
{{- include "hami-dra.serviceAccountName" (dict "root" . "key" "controller" "component" "controller") }}
{{- end }}
{{- define "hami-dra.webhookServiceAccount" -}}
{{- include "hami-dra.serviceAccountName" (dict "root" . "key" "webhook" "component" "webhook") }}
{{- end }}

{{- define "hami-dra.webhookServiceName" -}}
{{- include "hami-dra.componentName" (dict "root" . "component" "webhook") }}
{{- end }}

{{- define "hami-dra.webhookSecretName" -}}
{{- if eq .Values.webhook.certificate.mode "existing" }}
{{- required "webhook.certificate.existing.secretName is required when webhook.certificate.mode is existing" .Values.webhook.certificate.existing.secretName }}
{{- else }}
{{- include "hami-dra.componentName" (dict "root" . "component" "webhook-tls") }}
{{- end }}
{{- end }}

{{- define "hami-dra.pluginDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletPlugin.kubeletRootDir) .Values.driverName }}
{{- end }}

{{- define "hami-dra.registryDir" -}}
{{- printf "%s/plugins_registry" (trimSuffix "/" .Values.kubeletPlugin.kubeletRootDir) }}
{{- end }}

{{- define "hami-dra.pluginPrivileged" -}}
{{- $p := .Values.kubeletPlugin.privileged }}
{{- if eq (toString $p) "auto" }}
{{- eq .Values.kubeletPlugin.source "nvml" }}
{{- else }}
{{- $p }}
{{- end }}
{{- end }}

{{/* The global -v flag for .Values.logVerbosity (empty at 0). */}}
{{- define "hami-dra.verbosityFlag" -}}
{{- if gt (int .Values.logVerbosity) 0 }}
{{- printf "-%s" (repeat (int .Values.logVerbosity) "v") }}
{{- end }}
{{- end }}

{{/*
GpuConfig opaque parameters for a DeviceClass: only the keys that are set, so the controller's
defaults (and claim config, which takes precedence) stay in charge of the rest.
*/}}
{{- define "hami-dra.gpuConfig" -}}
apiVersion: gpu.hami.io/v1alpha1
kind: GpuConfig
{{- with .policy }}
policy: {{ . | quote }}
{{- end }}
{{- with .nodePolicy }}
nodePolicy: {{ . | quote }}
{{- end }}
{{- with .scoringWeights }}
scoringWeights:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if hasKey . "numaBind" }}
numaBind: {{ .numaBind }}
{{- end }}
{{- if .allowUnenforcedShares }}
allowUnenforcedShares: true
{{- end }}
{{- end }}

{{/* The "Common recipes" of docs/policies.md: DeviceClass name prefix -> policy chain. */}}
{{- define "hami-dra.recipes" -}}
binpack: binpack
spread: spread
mutex: mutex
binpack-numa: binpack,numa
mutex-binpack: mutex,binpack
mutex-binpack-numa: mutex,binpack,numa
{{- end }}

{{/* The names of the DeviceClasses the chart installs, plus admissionPolicy.extraDeviceClasses, as a
JSON list: the tenant admission policies (tenant-policies.yaml) guard claims of these classes. */}}
{{- define "hami-dra.classNames" -}}
{{- $names := list }}
{{- range .Values.deviceClasses }}
{{- $names = append $names .name }}
{{- end }}
{{- if .Values.recipeClasses.enabled }}
{{- range $recipe, $policy := include "hami-dra.recipes" . | fromYaml }}
{{- $names = append $names (printf "%s.%s" $recipe $.Values.driverName) }}
{{- end }}
{{- end }}
{{- range .Values.admissionPolicy.extraDeviceClasses }}
{{- $names = append $names . }}
{{- end }}
{{- $names | uniq | toJson }}
{{- end }}

{{- define "hami-dra.controllerUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "hami-dra.controllerServiceAccount" . }}
{{- end }}

{{/*
A webhook's namespaceSelector: ``base`` plus the namespaces our pod webhooks never serve (kube-system,
the release's, webhook.excludeNamespaces, and any an admin labels <driver>/admission=disabled):
system pods must start whatever the webhook's state, and tenants can neither create pods there nor
label namespaces, so nothing escapes the gate this way. Call with (dict "root" $ "base" selector).
*/}}
{{- define "hami-dra.podWebhookNamespaceSelector" -}}
{{- $root := .root }}
{{- $excluded := uniq (concat (list "kube-system" $root.Release.Namespace) $root.Values.webhook.excludeNamespaces) }}
{{- $exclusions := list (dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" $excluded) (dict "key" (printf "%s/admission" $root.Values.driverName) "operator" "NotIn" "values" (list "disabled")) }}
{{- $selector := deepCopy .base }}
{{- $_ := set $selector "matchExpressions" (concat (default (list) $selector.matchExpressions) $exclusions) }}
{{- toYaml $selector }}
{{- end }}

{{- /* Where HAMi's resources are translated: webhook.hamiResources.translate, off without the webhook. */}}
{{- define "hami-dra.hamiTranslate" -}}
{{- ternary .Values.webhook.hamiResources.translate "off" .Values.webhook.enabled }}
{{- end }}

{{- /* The DeviceClass of HAMi-translated claims: webhook.hamiResources.deviceClassName, else the
first of deviceClasses; empty: the driver's own name (the binaries' default). */}}
{{- define "hami-dra.hamiDeviceClass" -}}
{{- $hamiClass := .Values.webhook.hamiResources.deviceClassName }}
{{- if and (not $hamiClass) .Values.deviceClasses }}
{{- $hamiClass = (first .Values.deviceClasses).name }}
{{- end }}
{{- $hamiClass }}
{{- end }}
