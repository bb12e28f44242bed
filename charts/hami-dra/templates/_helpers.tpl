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
{{- include "hami-dra.imageRef" (dict "root" . "repository" .Values.image.repository "tag" (default .Chart.AppVersion .Values.image.tag)) }}
{{- end }}

{{/* <repository>:<tag>, pulled from global.imageRegistry when set (a mirror for air-gapped clusters):
the registry host the repository names, if any (a first part with a dot or a port, or localhost),
is replaced by it and the path kept, so docker.io/projecthami/hami becomes <mirror>/projecthami/hami
and hami-dra <mirror>/hami-dra. Pass (dict "root" $ "repository" R "tag" T). */}}
{{- define "hami-dra.imageRef" -}}
{{- $repository := .repository }}
{{- $registry := trimSuffix "/" ((.root.Values.global | default dict).imageRegistry | default "") }}
{{- if $registry }}
{{- $parts := splitList "/" $repository }}
{{- $first := first $parts }}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- $repository = join "/" (rest $parts) }}
{{- end }}
{{- $repository = printf "%s/%s" $registry $repository }}
{{- end }}
{{- printf "%s:%s" $repository .tag }}
{{- end }}

{{/* HAMi-core (libvgpu.so), which enforces shares, as YAML: mode (image, hostPath or none: `auto`
is the image for real GPUs, the admin's library when hamiCoreLib is set, nothing for simulated
ones), lib (the host path the plugin preloads, "" for none) and dir (its directory, mounted at the
same path in the plugin's container and the installer's, because the CDI specs bind-mount the
library from the host into containers). Contradictions and system directories fail the render. */}}
{{- define "hami-dra.hamiCore" -}}
{{- $kp := .Values.kubeletPlugin }}
{{- $hc := $kp.hamiCore }}
{{- $mode := $hc.install }}
{{- if eq $mode "auto" }}
{{- $mode = ternary "hostPath" (ternary "image" "none" (eq $kp.source "nvml")) (ne $kp.hamiCoreLib "") }}
{{- end }}
{{- if and $kp.hamiCoreLib (ne $mode "hostPath") }}
{{- fail (printf "kubeletPlugin.hamiCoreLib (%s) is a library the admin placed, used with kubeletPlugin.hamiCore.install hostPath (or auto), not %s: unset one of them" $kp.hamiCoreLib $mode) }}
{{- end }}
{{- $hostDir := trimSuffix "/" $hc.hostDir }}
{{- $lib := "" }}
{{- $dir := "" }}
{{- if eq $mode "image" }}
{{- $dir = $hostDir }}
{{- $lib = printf "%s/libvgpu.so" $dir }}
{{- else if eq $mode "hostPath" }}
{{- $lib = $kp.hamiCoreLib | default (printf "%s/libvgpu.so" $hostDir) }}
{{- $dir = dir $lib }}
{{- end }}
{{- /* The directory is mounted over the same path in the plugin's container (and written to by the
installer): a system directory there would hide the plugin's own files. */}}
{{- $systemDirs := "^(/?|/(bin|sbin|boot|dev|etc|lib[0-9]*|proc|sys|usr/(bin|sbin|lib[0-9]*|libexec|include|share)|opt/hami-dra|(var/)?run/secrets)(/.*)?|/(usr|usr/local|usr/local/(bin|sbin|lib[0-9]*)|opt|var|var/lib|var/run|run|tmp|root|home))$" }}
{{- if and $lib (regexMatch $systemDirs $dir) }}
{{- fail (printf "HAMi-core's directory %q would be mounted over the same path in the kubelet plugin's container; use a directory of its own, such as /usr/local/vgpu (kubeletPlugin.hamiCore.hostDir, kubeletPlugin.hamiCoreLib)" $dir) }}
{{- end }}
mode: {{ $mode }}
lib: {{ $lib | quote }}
dir: {{ $dir | quote }}
{{- end }}

{{/* Where the node DaemonSets run (the kubelet plugin and HAMi-core's installer, which must land on
the same nodes): the plugin's nodeSelector, tolerations and affinity, by default NVIDIA GPU nodes
only (either label) with the nvml source, because CPU-only and control-plane nodes have no NVML. */}}
{{- define "hami-dra.nodePlacement" -}}
{{- $kp := .Values.kubeletPlugin }}
{{- with $kp.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $kp.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $kp.affinity }}
affinity:
  {{- toYaml $kp.affinity | nindent 2 }}
{{- else if and (eq $kp.source "nvml") $kp.gpuNodesOnly }}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions:
            - {key: feature.node.kubernetes.io/pci-10de.present, operator: In, values: ["true"]}
        - matchExpressions:
            - {key: nvidia.com/gpu.present, operator: In, values: ["true"]}
{{- end }}
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
{{- if .Values.migClass.enabled }}
{{- $names = append $names (printf "mig.%s" $.Values.driverName) }}
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

{{- /* How new claims of our classes get the controller's finalizer at admission (controller.claimFinalizer):
"policy" (a MutatingAdmissionPolicy, in the API server), "webhook" (the webhook's /mutate-claims) or ""
(none: the controller adds it before the allocation). auto: the policy where the API server serves
admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (Kubernetes 1.36+), else the webhook. */}}
{{- define "hami-dra.claimFinalizer" -}}
{{- $mode := .Values.controller.claimFinalizer }}
{{- $served := .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" }}
{{- if not .Values.controller.enabled }}
{{- else if or (eq $mode "policy") (and (eq $mode "auto") $served) }}policy
{{- else if and .Values.webhook.enabled (or (eq $mode "webhook") (eq $mode "auto")) }}webhook
{{- end }}
{{- end }}
{{- /* CEL: a container of the pod asks for one of HAMi's nvidia.com/gpu* resources (the
hami-resources webhook's match condition; dra_driver/webhook/pod_gate.py ASKS_FOR_HAMI_RESOURCES). */}}
{{- define "hami-dra.asksForHamiResources" -}}
(object.spec.containers + object.spec.?initContainers.orValue([])).exists(c, c.?resources.?limits.orValue({}).exists(k, k.startsWith('nvidia.com/gpu')) || c.?resources.?requests.orValue({}).exists(k, k.startsWith('nvidia.com/gpu')))
{{- end }}

{{- /* What adds the scheduling gate to new pods with claims (webhook.podGate): "policy" (a
MutatingAdmissionPolicy, in the API server: templates/pod-gate.yaml), "webhook" (its /mutate) or ""
(no webhook: nothing). auto: the policy where the API server serves admissionregistration.k8s.io/v1
MutatingAdmissionPolicy (Kubernetes 1.36+), else the webhook (NOTES.txt says so). */}}
{{- define "hami-dra.podGate" -}}
{{- $mode := .Values.webhook.podGate }}
{{- $served := .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" }}
{{- if not .Values.webhook.enabled }}
{{- else if or (eq $mode "policy") (and (eq $mode "auto") $served) }}policy
{{- else if or (eq $mode "webhook") (eq $mode "auto") }}webhook
{{- else }}
{{- fail (printf "webhook.podGate must be webhook, auto or policy, not %q" $mode) }}
{{- end }}
{{- end }}
{{- /*
Names the controller writes whatever the driver's name (dra_driver/contract.py: GATE_NAME, FINALIZER,
ALLOCATED_CONDITION; controller/binder.py FENCE_ANNOTATION): the admission policies must guard these,
not "<driverName>/…", or a custom driverName would leave the real gate unguarded and refuse the
controller's own writes. tests/chart/test_tenant_policies.py checks them against the code.
*/}}
{{- define "hami-dra.gateName" -}}gpu.hami.io/allocation{{- end }}
{{- define "hami-dra.finalizerName" -}}gpu.hami.io/allocation{{- end }}
{{- define "hami-dra.conditionType" -}}gpu.hami.io/Allocated{{- end }}
{{- define "hami-dra.fenceAnnotation" -}}gpu.hami.io/fenced-by{{- end }}
