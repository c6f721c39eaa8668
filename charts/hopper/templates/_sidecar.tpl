{{/*
The Hopper sidecar as named templates, the chart's public interface for
parent charts. Each takes the context dict of _helpers.tpl; in a parent
chart that lists hopper as a dependency, its one values block is
.Values.hopper:

  containers:
    - name: my-app
      ...
    {{- include "hopper.sidecar" (dict "values" .Values.hopper "context" $) | nindent 4 }}
  volumes:
    {{- include "hopper.volumes" (dict "values" .Values.hopper "context" $) | nindent 4 }}

The dependency itself renders the ConfigMap and the metrics objects (with
deployment.enabled: false it renders no Deployment). Optional helpers:

  hopper.podAnnotations                checksum/hopper-config (rolls pods on config change)
  hopper.terminationGracePeriodSeconds shutdown.grace + margin, in seconds
  hopper.nativeSidecar                 "true" when the container belongs under initContainers
  hopper.config                        the rendered hopper.yaml
  hopper.configmap                     the ConfigMap manifest holding hopper.yaml
*/}}

{{/* Paths inside the Hopper container. */}}
{{- define "hopper.configPath" -}}/etc/hopper/hopper.yaml{{- end -}}
{{- define "hopper.brokerSecretDir" -}}/etc/hopper/broker{{- end -}}
{{- define "hopper.tlsSecretDir" -}}/etc/hopper/tls{{- end -}}
{{- define "hopper.appTokenDir" -}}/etc/hopper/app-token{{- end -}}
{{- define "hopper.appHmacDir" -}}/etc/hopper/app-hmac{{- end -}}
{{- define "hopper.appWebhooksDir" -}}/etc/hopper/app-webhooks{{- end -}}
{{- define "hopper.appSATokenDir" -}}/etc/hopper/app-sa-token{{- end -}}
{{- define "hopper.appTLSDir" -}}/etc/hopper/app-tls{{- end -}}
{{- define "hopper.otelCADir" -}}/etc/hopper/otel{{- end -}}

{{/*
hopper.durationSeconds: a Go duration string ("25s", "1m30s", "500ms") in
whole seconds, rounded up. Context: the string.
*/}}
{{- define "hopper.durationSeconds" -}}
{{- $d := toString . | trim -}}
{{- if not (regexMatch "^([0-9]*\\.?[0-9]+(ns|us|µs|ms|h|m|s))+$" $d) -}}
{{- fail (printf "hopper: %q is not a duration with a unit, like \"25s\"" $d) -}}
{{- end -}}
{{- $factors := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]*\\.?[0-9]+(ns|us|µs|ms|h|m|s)" $d -1 -}}
{{- $num := regexFind "^[0-9]*\\.?[0-9]+" . -}}
{{- $unit := trimPrefix $num . -}}
{{- $total = addf $total (mulf (float64 $num) (get $factors $unit)) -}}
{{- end -}}
{{- ceil $total | int -}}
{{- end -}}

{{/*
hopper.effectiveConfig: hopper.config with the chart's additions, as YAML.
Fails the render with a clear message on a setting Kubernetes cannot run.
*/}}
{{- define "hopper.effectiveConfig" -}}
{{- $v := .values -}}
{{- $hv := $v -}}
{{- $cfg := deepCopy (default (dict) $hv.config) -}}
{{- /* queues: config.queue.name for one queue, or config.subscriptions for
       several; never both, since Hopper would not know which one a
       top-level name belongs to. */ -}}
{{- $queue := default (dict) (get $cfg "queue") -}}
{{- $subs := default (list) (get $cfg "subscriptions") -}}
{{- if and (get $queue "name") $subs -}}
{{- fail "set config.queue.name (one queue) or config.subscriptions (several queues), not both: with subscriptions each entry names its queue in queue.name" -}}
{{- end -}}
{{- if not (or (get $queue "name") $subs) -}}
{{- fail "config.queue.name or config.subscriptions is required: the RabbitMQ work queue Hopper consumes, or a list of subscriptions with one queue each" -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $i, $s := $subs -}}
{{- $name := dig "queue" "name" "" $s -}}
{{- if not $name -}}
{{- fail (printf "config.subscriptions[%d].queue.name is required: the queue this subscription consumes" $i) -}}
{{- end -}}
{{- if hasKey $seen $name -}}
{{- fail (printf "config.subscriptions[%d].queue.name %q is already used by config.subscriptions[%d]: each subscription consumes a queue of its own" $i $name (get $seen $name)) -}}
{{- end -}}
{{- $_ := set $seen $name $i -}}
{{- end -}}

{{- /* Ordering holds within one pod only: several pods on one queue take
       its messages in turn, so consumer.ordered (and a per-key
       consumer.orderingKey) would promise an order no pod keeps. A queue
       with a single active consumer is consumed by one pod at a time,
       the others standing by, and keeps it. Each queue is checked with
       what its subscription inherits. In a parent chart's own Deployment
       its replicas are out of this chart's sight. */ -}}
{{- $deploy := default (dict) $v.deployment -}}
{{- $scalers := list -}}
{{- if get (default (dict) $v.keda) "enabled" -}}{{- $scalers = append $scalers "keda.enabled" -}}{{- end -}}
{{- if get (default (dict) $v.autoscaling) "enabled" -}}{{- $scalers = append $scalers "autoscaling.enabled" -}}{{- end -}}
{{- if and (ne (get $deploy "enabled") false) (gt (int (default 1 (get $deploy "replicas"))) 1) -}}
{{- $scalers = append $scalers (printf "deployment.replicas %d" (int (get $deploy "replicas"))) -}}
{{- end -}}
{{- if $scalers -}}
{{- $topCons := default (dict) (get $cfg "consumer") -}}
{{- /* A partitioned queue's partitions each have a single active
       consumer of their own. */ -}}
{{- $topParts := int (dig "topology" "partitions" "count" 0 $cfg) -}}
{{- $queues := list (dict "path" "config" "queue" $queue "consumer" $topCons "parts" (gt $topParts 0)) -}}
{{- if $subs -}}{{- $queues = list -}}{{- end -}}
{{- range $i, $s := $subs -}}
{{- /* A key the subscription sets wins, false included; merge would
       take a false for unset. */ -}}
{{- $sq := deepCopy (pick $queue "singleActiveConsumer") -}}
{{- range $k, $val := default (dict) (get $s "queue") -}}{{- $_ := set $sq $k $val -}}{{- end -}}
{{- $sc := deepCopy (pick $topCons "ordered" "orderingKey") -}}
{{- range $k, $val := default (dict) (get $s "consumer") -}}{{- $_ := set $sc $k $val -}}{{- end -}}
{{- $queues = append $queues (dict "path" (printf "config.subscriptions[%d]" $i) "queue" $sq "consumer" $sc "parts" (gt (int (dig "partitions" "count" $topParts $s)) 0)) -}}
{{- end -}}
{{- range $queues -}}
{{- $ordered := get .consumer "ordered" -}}
{{- $key := toString (default "" (get .consumer "orderingKey")) -}}
{{- if and (or (eq (toString $ordered) "true") (ne $key "")) (ne (toString (get .queue "singleActiveConsumer")) "true") (not .parts) -}}
{{- fail (printf "%s.consumer.%s with %s: order holds within one pod only, and several pods would take the queue's messages in turn. Set %s.queue.singleActiveConsumer: true (one pod consumes at a time, the others stand by), or run one replica without autoscaling" .path (ternary "ordered: true" (printf "orderingKey %q" $key) (eq (toString $ordered) "true")) (join ", " $scalers) .path) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* app: Hopper delivers to the app container on localhost, over
       https when app.tls.existingSecret gives it the app's CA. */ -}}
{{- $app := default (dict) (get $cfg "app") -}}
{{- $at := default (dict) $v.app.tls -}}
{{- if not (hasKey $app "url") -}}
{{- $_ := set $app "url" (printf "%s://127.0.0.1:%d%s" (ternary "https" "http" (not (empty $at.existingSecret))) (int $v.app.port) (default "/" $v.app.messagePath)) -}}
{{- end -}}
{{- if and (not (hasKey $app "healthPath")) $v.app.healthPath -}}
{{- $_ := set $app "healthPath" $v.app.healthPath -}}
{{- end -}}

{{- /* app.auth and app.tls: files from mounted Secrets. Each Secret is
       mounted as a folder (no subPath), so the kubelet swaps in a rotated
       Secret and Hopper, which reads these files again when they change,
       uses it without a restart. */ -}}
{{- $aa := default (dict) $v.app.auth -}}
{{- $auth := default (dict) (get $app "auth") -}}
{{- range $name, $f := dict "token" (list "file" (include "hopper.appTokenDir" $) "token" "token") "hmac" (list "keyFile" (include "hopper.appHmacDir" $) "key" "HMAC key") "standardWebhooks" (list "secretFile" (include "hopper.appWebhooksDir" $) "secrets" "Standard Webhooks secrets") -}}
{{- $s := default (dict) (get $aa $name) -}}
{{- if $s.existingSecret -}}
{{- if not $s.key -}}
{{- fail (printf "app.auth.%s.key is required with app.auth.%s.existingSecret: the Secret's key holding the %s" $name $name (index $f 3)) -}}
{{- end -}}
{{- $sect := default (dict) (get $auth $name) -}}
{{- if hasKey $sect (index $f 0) -}}
{{- fail (printf "set app.auth.%s.existingSecret or config.app.auth.%s.%s, not both" $name $name (index $f 0)) -}}
{{- end -}}
{{- $_ := set $sect (index $f 0) (printf "%s/%s" (index $f 1) (index $f 2)) -}}
{{- $_ := set $auth $name $sect -}}
{{- end -}}
{{- end -}}
{{- /* app.auth.serviceAccountToken: a projected token of the pod's
       ServiceAccount is Hopper's token; the kubelet renews the file and
       Hopper reads it again. */ -}}
{{- with $aa.serviceAccountToken -}}
{{- if .audience -}}
{{- if dig "token" "existingSecret" "" $aa -}}
{{- fail "set app.auth.serviceAccountToken.audience or app.auth.token.existingSecret, not both: each is Hopper's token" -}}
{{- end -}}
{{- $sect := default (dict) (get $auth "token") -}}
{{- if hasKey $sect "file" -}}
{{- fail "set app.auth.serviceAccountToken.audience or config.app.auth.token.file, not both" -}}
{{- end -}}
{{- $_ := set $sect "file" (printf "%s/token" (include "hopper.appSATokenDir" $)) -}}
{{- $_ := set $auth "token" $sect -}}
{{- end -}}
{{- end -}}
{{- if $auth -}}
{{- $_ := set $app "auth" $auth -}}
{{- end -}}
{{- if $at.existingSecret -}}
{{- if ne (empty $at.certKey) (empty $at.keyKey) -}}
{{- fail "app.tls.certKey and keyKey must be given together" -}}
{{- end -}}
{{- if not (hasPrefix "https://" (toString (get $app "url"))) -}}
{{- fail (printf "app.tls.existingSecret is for an https:// app, but config.app.url is %q: leave config.app.url unset (the chart then uses https://127.0.0.1:<app.port>) or make it https://" (get $app "url")) -}}
{{- end -}}
{{- $tls := default (dict) (get $app "tls") -}}
{{- range $field, $pair := dict "caFile" (list $at.caKey "ca.crt") "certFile" (list $at.certKey "tls.crt") "keyFile" (list $at.keyKey "tls.key") -}}
{{- if index $pair 0 -}}
{{- if hasKey $tls $field -}}
{{- fail (printf "set app.tls.existingSecret or config.app.tls.%s, not both" $field) -}}
{{- end -}}
{{- $_ := set $tls $field (printf "%s/%s" (include "hopper.appTLSDir" $) (index $pair 1)) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $app "tls" $tls -}}
{{- else if or $at.certKey $at.keyKey -}}
{{- fail "app.tls.certKey/keyKey need app.tls.existingSecret" -}}
{{- end -}}
{{- $_ := set $cfg "app" $app -}}

{{- /* admin: probes and metrics need it on the pod's address. */ -}}
{{- $admin := default (dict) (get $cfg "admin") -}}
{{- $listen := toString (default ":9090" (get $admin "listen")) -}}
{{- if not (regexMatch "^(|0\\.0\\.0\\.0|\\[::\\]|::):[0-9]{1,5}$" $listen) -}}
{{- fail (printf "config.admin.listen %q: the probes reach Hopper on the pod's address, so listen on all interfaces, like \":9090\"" $listen) -}}
{{- end -}}
{{- $_ := set $admin "listen" $listen -}}
{{- $_ := set $cfg "admin" $admin -}}

{{- /* broker: credentials and TLS files from mounted Secrets. */ -}}
{{- $b := $hv.broker -}}
{{- $broker := default (dict) (get $cfg "broker") -}}
{{- if or $b.urlKey $b.usernameKey $b.passwordKey -}}
{{- if not $b.existingSecret -}}
{{- fail "broker.existingSecret is required when urlKey, usernameKey or passwordKey is set" -}}
{{- end -}}
{{- end -}}
{{- if and $b.existingSecret (not (or $b.urlKey $b.usernameKey $b.passwordKey)) -}}
{{- fail "broker.existingSecret is set but none of urlKey, usernameKey, passwordKey says which of its keys to use" -}}
{{- end -}}
{{- range $field, $key := dict "usernameFile" $b.usernameKey "passwordFile" $b.passwordKey -}}
{{- if $key -}}
{{- if hasKey $broker $field -}}
{{- fail (printf "set broker.%sKey or config.broker.%s, not both" (trimSuffix "File" $field) $field) -}}
{{- end -}}
{{- $_ := set $broker $field (printf "%s/%s" (include "hopper.brokerSecretDir" $) (trimSuffix "File" $field)) -}}
{{- end -}}
{{- end -}}
{{- if and (or $b.usernameKey $b.passwordKey) (not $b.urlKey) (not (get $broker "urls")) -}}
{{- fail "config.broker.urls must name the broker (without credentials) when broker.usernameKey/passwordKey supply them" -}}
{{- end -}}
{{- $t := $b.tls -}}
{{- if $t.existingSecret -}}
{{- if ne (empty $t.certKey) (empty $t.keyKey) -}}
{{- fail "broker.tls.certKey and keyKey must be given together" -}}
{{- end -}}
{{- $tls := default (dict) (get $broker "tls") -}}
{{- range $field, $pair := dict "caFile" (list $t.caKey "ca.crt") "certFile" (list $t.certKey "tls.crt") "keyFile" (list $t.keyKey "tls.key") -}}
{{- if index $pair 0 -}}
{{- if hasKey $tls $field -}}
{{- fail (printf "set broker.tls.existingSecret or config.broker.tls.%s, not both" $field) -}}
{{- end -}}
{{- $_ := set $tls $field (printf "%s/%s" (include "hopper.tlsSecretDir" $) (index $pair 1)) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $broker "tls" $tls -}}
{{- else if or $t.certKey $t.keyKey -}}
{{- fail "broker.tls.certKey/keyKey need broker.tls.existingSecret" -}}
{{- end -}}
{{- if $broker -}}
{{- $_ := set $cfg "broker" $broker -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
hopper.queues: the work queues Hopper consumes, as a JSON list (read it
with fromJsonArray): config.queue.name, or the queue.name of each
subscription in order.
*/}}
{{- define "hopper.queues" -}}
{{- $cfg := fromYaml (include "hopper.effectiveConfig" .) -}}
{{- $names := list -}}
{{- range default (list) (get $cfg "subscriptions") -}}
{{- $names = append $names (dig "queue" "name" "" .) -}}
{{- end -}}
{{- if not $names -}}
{{- $names = list (dig "queue" "name" "" $cfg) -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{/*
hopper.consumedQueues: the queues Hopper consumes, as a JSON list: those of
hopper.queues, each partitioned one (topology.partitions.count, or a
subscription's partitions.count) replaced by its partition queues
<queue>.p0 … as Hopper names them, and each stream by the subscription's
own queue beside it, <stream>.<consumer>: a stream keeps what was read, so
its message count is no backlog.
*/}}

{{/*
hopper.streamQueues: the own queues (<stream>.<consumer>) of the stream
subscriptions, as a JSON list: the queue label of their lag metric.
*/}}
{{- define "hopper.streamQueues" -}}
{{- $cfg := fromYaml (include "hopper.effectiveConfig" .) -}}
{{- $subs := default (list) (get $cfg "subscriptions") -}}
{{- if not $subs -}}
{{- $subs = list (dict "queue" (dict "name" (dig "queue" "name" "" $cfg))) -}}
{{- end -}}
{{- $topType := dig "queue" "type" "" $cfg -}}
{{- $topConsumer := dig "queue" "stream" "consumer" "" $cfg -}}
{{- $out := list -}}
{{- range $subs -}}
{{- if eq (dig "queue" "type" $topType .) "stream" -}}
{{- $out = append $out (printf "%s.%s" (dig "queue" "name" "" .) (dig "queue" "stream" "consumer" $topConsumer .)) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}
{{- define "hopper.consumedQueues" -}}
{{- $cfg := fromYaml (include "hopper.effectiveConfig" .) -}}
{{- $top := int (dig "topology" "partitions" "count" 0 $cfg) -}}
{{- $subs := default (list) (get $cfg "subscriptions") -}}
{{- if not $subs -}}
{{- $subs = list (dict "queue" (dict "name" (dig "queue" "name" "" $cfg))) -}}
{{- end -}}
{{- $out := list -}}
{{- $topType := dig "queue" "type" "" $cfg -}}
{{- $topConsumer := dig "queue" "stream" "consumer" "" $cfg -}}
{{- range $subs -}}
{{- $name := dig "queue" "name" "" . -}}
{{- $n := int (dig "partitions" "count" $top .) -}}
{{- if eq (dig "queue" "type" $topType .) "stream" -}}
{{- $out = append $out (printf "%s.%s" $name (dig "queue" "stream" "consumer" $topConsumer .)) -}}
{{- else if gt $n 0 -}}
{{- range $i := until $n -}}
{{- $out = append $out (printf "%s.p%d" $name $i) -}}
{{- end -}}
{{- else -}}
{{- $out = append $out $name -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
hopper.partitionCap: when every consumed queue is partitioned, the largest
partition count: each partition has one active consumer, so replicas past
it only stand by and an autoscaler has no use for them. 0 when a queue is
not partitioned (any replica may then take its share of that queue).
*/}}
{{- define "hopper.partitionCap" -}}
{{- $cfg := fromYaml (include "hopper.effectiveConfig" .) -}}
{{- $top := int (dig "topology" "partitions" "count" 0 $cfg) -}}
{{- $subs := default (list) (get $cfg "subscriptions") -}}
{{- $cap := $top -}}
{{- if $subs -}}
{{- $cap = 0 -}}
{{- $all := true -}}
{{- range $subs -}}
{{- $n := int (dig "partitions" "count" $top .) -}}
{{- if eq $n 0 }}{{ $all = false }}{{ end -}}
{{- if gt $n $cap }}{{ $cap = $n }}{{ end -}}
{{- end -}}
{{- if not $all }}{{ $cap = 0 }}{{ end -}}
{{- end -}}
{{- $cap -}}
{{- end -}}

{{/* hopper.config: the hopper.yaml Hopper reads (ends with one newline). */}}
{{- define "hopper.config" -}}
{{- include "hopper.effectiveConfig" . }}
{{ end -}}

{{- define "hopper.adminPort" -}}
{{- $cfg := fromYaml (include "hopper.effectiveConfig" .) -}}
{{- regexFind "[0-9]+$" $cfg.admin.listen | int -}}
{{- end -}}

{{- define "hopper.graceSeconds" -}}
{{- $cfg := fromYaml (include "hopper.effectiveConfig" .) -}}
{{- include "hopper.durationSeconds" (dig "shutdown" "grace" "25s" $cfg) -}}
{{- end -}}

{{- define "hopper.nativeSidecar" -}}
{{- if .values.nativeSidecar -}}
{{- if semverCompare "<1.29.0-0" .context.Capabilities.KubeVersion.Version -}}
{{- fail (printf "nativeSidecar needs Kubernetes >= 1.29 (sidecar init containers with restartPolicy: Always); this cluster is %s" .context.Capabilities.KubeVersion.Version) -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/*
hopper.terminationGracePeriodSeconds: the pod's grace period. Hopper needs
shutdown.grace plus a margin; as a native sidecar it gets SIGTERM only after
the app has exited, so the app's stop time counts too. An explicit
terminationGracePeriodSeconds (top-level value) must leave Hopper its grace.
*/}}
{{- define "hopper.terminationGracePeriodSeconds" -}}
{{- $grace := include "hopper.graceSeconds" . | int -}}
{{- $need := $grace -}}
{{- if eq (include "hopper.nativeSidecar" .) "true" -}}
{{- $need = add $need (int .values.app.stopSeconds) -}}
{{- end -}}
{{- $explicit := .values.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $explicit -}}
{{- add $need (int .values.terminationGraceMarginSeconds) -}}
{{- else if le (int $explicit) $need -}}
{{- fail (printf "terminationGracePeriodSeconds %d leaves Hopper no time to drain: it must exceed config.shutdown.grace (%ds)%s" (int $explicit) $grace (ternary " plus app.stopSeconds (native sidecar)" "" (eq (include "hopper.nativeSidecar" .) "true"))) -}}
{{- else -}}
{{- int $explicit -}}
{{- end -}}
{{- end -}}

{{- define "hopper.podAnnotations" -}}
checksum/hopper-config: {{ include "hopper.config" . | sha256sum }}
{{- end -}}

{{- define "hopper.configmap" -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "hopper.configMapName" . }}
  labels:
    {{- include "hopper.labels" . | nindent 4 }}
    app.kubernetes.io/component: hopper
data:
  hopper.yaml: |
    {{- include "hopper.config" . | nindent 4 }}
{{- end -}}

{{/*
Secret files are world-readable (0444): Kubernetes makes them root-owned,
and Hopper runs as 65532 whether or not the pod sets an fsGroup. Only the
Hopper container mounts them.
*/}}
{{- define "hopper.volumes" -}}
{{- $b := .values.broker -}}
- name: hopper-config
  configMap:
    name: {{ include "hopper.configMapName" . }}
{{- if or $b.usernameKey $b.passwordKey }}
- name: hopper-broker
  secret:
    secretName: {{ $b.existingSecret }}
    defaultMode: 0444
    items:
      {{- if $b.usernameKey }}
      - key: {{ $b.usernameKey }}
        path: username
      {{- end }}
      {{- if $b.passwordKey }}
      - key: {{ $b.passwordKey }}
        path: password
      {{- end }}
{{- end }}
{{- with $b.tls }}
{{- if .existingSecret }}
- name: hopper-tls
  {{- include "hopper.tlsVolume" . | nindent 2 }}
{{- end }}
{{- end }}
{{- $aa := default (dict) .values.app.auth }}
{{- with $aa.token }}
{{- if .existingSecret }}
- name: hopper-app-token
  secret:
    secretName: {{ .existingSecret }}
    defaultMode: 0444
    items:
      - key: {{ .key }}
        path: token
{{- end }}
{{- end }}
{{- with $aa.hmac }}
{{- if .existingSecret }}
- name: hopper-app-hmac
  secret:
    secretName: {{ .existingSecret }}
    defaultMode: 0444
    items:
      - key: {{ .key }}
        path: key
{{- end }}
{{- end }}
{{- with $aa.standardWebhooks }}
{{- if .existingSecret }}
- name: hopper-app-webhooks
  secret:
    secretName: {{ .existingSecret }}
    defaultMode: 0444
    items:
      - key: {{ .key }}
        path: secrets
{{- end }}
{{- end }}
{{- with $aa.serviceAccountToken }}
{{- if .audience }}
- name: hopper-app-sa-token
  projected:
    defaultMode: 0444
    sources:
      - serviceAccountToken:
          audience: {{ .audience | quote }}
          expirationSeconds: {{ int64 (default 3600 .expirationSeconds) }}
          path: token
{{- end }}
{{- end }}
{{- with .values.app.tls }}
{{- if .existingSecret }}
- name: hopper-app-tls
  {{- include "hopper.tlsVolume" . | nindent 2 }}
{{- end }}
{{- end }}
{{- with (include "hopper.otelCASecret" .) | fromJson }}
- name: hopper-otel-ca
  secret:
    secretName: {{ .name }}
    defaultMode: 0444
    items:
      - key: {{ .key }}
        path: ca.crt
{{- end }}
{{- end -}}

{{/*
hopper.tlsVolume: a Secret volume with a CA and an optional client
certificate, at the fixed names ca.crt, tls.crt and tls.key. Context: a
values block with existingSecret, caKey, certKey, keyKey.
*/}}
{{- define "hopper.tlsVolume" -}}
secret:
  secretName: {{ .existingSecret }}
  defaultMode: 0444
  items:
    {{- if .caKey }}
    - key: {{ .caKey }}
      path: ca.crt
    {{- end }}
    {{- if .certKey }}
    - key: {{ .certKey }}
      path: tls.crt
    - key: {{ .keyKey }}
      path: tls.key
    {{- end }}
{{- end -}}

{{/*
hopper.otelCASecret: otel.caSecret as JSON when tracing is on and it names
a Secret, else {}. The collector's CA is only used for an https://
endpoint (or a gRPC host:port, which is TLS), so a CA for a plain-text
endpoint fails the render rather than being silently unused.
*/}}
{{- define "hopper.otelCASecret" -}}
{{- $o := .values.otel -}}
{{- $ca := default (dict) $o.caSecret -}}
{{- if and $o.enabled $ca.name -}}
{{- if hasPrefix "http://" (toString $o.endpoint) -}}
{{- fail (printf "otel.caSecret is the CA of a TLS collector, but otel.endpoint %q is plain text: use https://" $o.endpoint) -}}
{{- end -}}
{{- if not $ca.key -}}
{{- fail "otel.caSecret.key is required with otel.caSecret.name: the Secret's key holding the collector's CA" -}}
{{- end -}}
{{- toJson $ca -}}
{{- else -}}
{}
{{- end -}}
{{- end -}}

{{/*
OTEL_* environment, in dependency order ($(VAR) references come after VAR).
k8s.container.name is containerName: every container that takes this
environment (the sidecar, the tool Job's) is named by it.
*/}}
{{- define "hopper.otelEnv" -}}
{{- $o := .values.otel -}}
{{- if not $o.enabled }}
- name: OTEL_SDK_DISABLED
  value: "true"
{{- else }}
{{- if not $o.endpoint }}
{{- fail "otel.endpoint is required when otel.enabled is true: Hopper exports traces only to an OTLP endpoint" }}
{{- end }}
- name: OTEL_SERVICE_NAME
  value: {{ default (include "hopper.fullname" .) $o.serviceName | quote }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $o.endpoint | quote }}
{{- with $o.headersSecret }}
{{- if .name }}
{{- if not .key }}
{{- fail "otel.headersSecret.key is required with otel.headersSecret.name: the Secret's key holding the headers (key=value,key2=value2)" }}
{{- end }}
- name: OTEL_EXPORTER_OTLP_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .key }}
{{- end }}
{{- end }}
{{- if ne (include "hopper.otelCASecret" .) "{}" }}
- name: OTEL_EXPORTER_OTLP_CERTIFICATE
  value: {{ include "hopper.otelCADir" . }}/ca.crt
{{- end }}
{{- with $o.protocol }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ . | quote }}
{{- end }}
{{- with $o.sampler }}
- name: OTEL_TRACES_SAMPLER
  value: {{ . | quote }}
{{- end }}
{{- with $o.samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ . | toString | quote }}
{{- end }}
{{- $attrs := list -}}
{{- range $k, $val := $o.resourceAttributes }}
{{- $attrs = append $attrs (printf "%s=%s" $k (toString $val)) -}}
{{- end }}
{{- if $o.kubernetesAttributes }}
- name: K8S_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: K8S_NAMESPACE_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: K8S_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- $attrs = concat $attrs (list "k8s.pod.name=$(K8S_POD_NAME)" "k8s.namespace.name=$(K8S_NAMESPACE_NAME)" "k8s.node.name=$(K8S_NODE_NAME)" (printf "k8s.container.name=%s" .values.containerName)) -}}
{{- end }}
{{- with $attrs }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
hopper.probe: a probe on the admin port. Timing fields alone probe the given
path; a probe that names its own handler (httpGet, tcpSocket, exec, grpc) is
used as it is. Context: dict "probe" <values> "path" <default path>.
*/}}
{{- define "hopper.probe" -}}
{{- $p := .probe -}}
{{- if or $p.httpGet $p.tcpSocket $p.exec $p.grpc -}}
{{- toYaml $p -}}
{{- else -}}
httpGet:
  path: {{ .path }}
  port: hopper-admin
{{- with $p }}
{{ toYaml . }}
{{- end }}
{{- end -}}
{{- end -}}

{{- define "hopper.sidecar" -}}
{{- $v := .values -}}
{{- $hv := $v -}}
{{- $b := $hv.broker -}}
{{- $port := include "hopper.adminPort" . | int -}}
- name: {{ $hv.containerName }}
  image: {{ include "hopper.image" (dict "image" $hv.image "values" $hv) | quote }}
  imagePullPolicy: {{ $hv.image.pullPolicy }}
  {{- if eq (include "hopper.nativeSidecar" .) "true" }}
  # Native sidecar: started before the app containers, stopped after them.
  restartPolicy: Always
  {{- end }}
  args: ["run"]
  env:
    {{- include "hopper.env" . | nindent 4 }}
  {{- with $hv.extraEnvFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: hopper-admin
      containerPort: {{ $port }}
      protocol: TCP
  livenessProbe:
    {{- include "hopper.probe" (dict "probe" $hv.livenessProbe "path" "/livez") | nindent 4 }}
  readinessProbe:
    {{- include "hopper.probe" (dict "probe" $hv.readinessProbe "path" "/readyz") | nindent 4 }}
  {{- with $hv.startupProbe }}
  startupProbe:
    {{- include "hopper.probe" (dict "probe" . "path" "/livez") | nindent 4 }}
  {{- end }}
  {{- with $hv.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $hv.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  terminationMessagePolicy: FallbackToLogsOnError
  volumeMounts:
    {{- include "hopper.volumeMounts" . | nindent 4 }}
{{- end -}}

{{/* hopper.env: the Hopper container's environment (list items). */}}
{{- define "hopper.env" -}}
{{- $b := .values.broker -}}
- name: HOPPER_CONFIG
  value: {{ include "hopper.configPath" . }}
{{- if $b.urlKey }}
- name: HOPPER_BROKER_URLS
  valueFrom:
    secretKeyRef:
      name: {{ $b.existingSecret }}
      key: {{ $b.urlKey }}
{{- end }}
{{ include "hopper.otelEnv" . | trim }}
{{- with .values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* hopper.volumeMounts: the Hopper container's mounts (list items). */}}
{{- define "hopper.volumeMounts" -}}
{{- $b := .values.broker -}}
- name: hopper-config
  mountPath: {{ include "hopper.configPath" . }}
  subPath: hopper.yaml
  readOnly: true
{{- if or $b.usernameKey $b.passwordKey }}
- name: hopper-broker
  mountPath: {{ include "hopper.brokerSecretDir" . }}
  readOnly: true
{{- end }}
{{- if $b.tls.existingSecret }}
- name: hopper-tls
  mountPath: {{ include "hopper.tlsSecretDir" . }}
  readOnly: true
{{- end }}
{{- $aa := default (dict) .values.app.auth }}
{{- if dig "token" "existingSecret" "" $aa }}
- name: hopper-app-token
  mountPath: {{ include "hopper.appTokenDir" . }}
  readOnly: true
{{- end }}
{{- if dig "hmac" "existingSecret" "" $aa }}
- name: hopper-app-hmac
  mountPath: {{ include "hopper.appHmacDir" . }}
  readOnly: true
{{- end }}
{{- if dig "standardWebhooks" "existingSecret" "" $aa }}
- name: hopper-app-webhooks
  mountPath: {{ include "hopper.appWebhooksDir" . }}
  readOnly: true
{{- end }}
{{- if dig "serviceAccountToken" "audience" "" $aa }}
- name: hopper-app-sa-token
  mountPath: {{ include "hopper.appSATokenDir" . }}
  readOnly: true
{{- end }}
{{- if (default (dict) .values.app.tls).existingSecret }}
- name: hopper-app-tls
  mountPath: {{ include "hopper.appTLSDir" . }}
  readOnly: true
{{- end }}
{{- if ne (include "hopper.otelCASecret" .) "{}" }}
- name: hopper-otel-ca
  mountPath: {{ include "hopper.otelCADir" . }}
  readOnly: true
{{- end }}
{{- with .values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}
