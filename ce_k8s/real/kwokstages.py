"""The kwok Stages that play a kubelet's pod and node lifecycle in the real-Kubernetes test bed.

kwok drops its built-in stages as soon as any Stage is configured, and its default pod stages never
finish a bare Pod (only Job-owned ones), so the bed ships its own set. A pod's life is read from
its annotations: the emulator's scenario (`sim.ce-k8s.io/scenario`, the grammar of
ce_k8s.sim.k8s_scenario: the words `run=`, `exit=`, `oom-after=` and `image-pull-error`, and the
image-name convention `does-not-exist`/`pull-error`), so the demo's pilots and the tests' pods
play the same lives on kwok as on the kubelet simulator, or explicit `kwok.ce-k8s.io/*` ones:

* ``kwok.ce-k8s.io/run-for``: a duration (``"2s"``) the main containers run before they end;
  without it (and without `run=`) a pod runs until it is deleted. Scenario durations are scaled
  by the bed's time scale, explicit ones are not.
* ``kwok.ce-k8s.io/exit-code`` and ``kwok.ce-k8s.io/reason``: how they end (``137`` and
  ``OOMKilled`` for an OOM kill, as `oom-after=` does); the phase is Succeeded for 0, Failed
  otherwise, as a kubelet with ``restartPolicy: Never`` reports it.
* ``kwok.ce-k8s.io/pull-error: "true"``: the image cannot be pulled. With init containers the
  first init container waits in ``ImagePullBackOff`` and the main containers in
  ``PodInitializing``, as a kubelet shows it (finding 2 of docs/real-kubernetes.md).
* ``spec.activeDeadlineSeconds``: a Running pod past its deadline fails with reason
  ``DeadlineExceeded`` and the kubelet's message, its containers killed with 137.
* a deletion: the pod is removed at once (grace period 0), as kwok's own fast stage does.

Times: kwok writes RFC 3339 with nanoseconds; the API server stores ``metav1.Time`` in whole
seconds, as every real kubelet's status reads back. Nodes carry the port of their kubelet endpoint
in the ``kwok.ce-k8s.io/kubelet-port`` annotation (the bed's kubelet stub, ce_k8s/real/kubeletstub.py).
"""

# ruff: noqa: E501 - the Stage templates are YAML and Go templates; their lines are kept whole
from __future__ import annotations

RUN_FOR = "kwok.ce-k8s.io/run-for"
EXIT_CODE = "kwok.ce-k8s.io/exit-code"
REASON = "kwok.ce-k8s.io/reason"
PULL_ERROR = "kwok.ce-k8s.io/pull-error"
KUBELET_PORT = "kwok.ce-k8s.io/kubelet-port"
MANAGED_LABEL = "kwok.ce-k8s.io/managed"   # kwok manages the nodes labelled "true"

_NODE_STATUS = """\
      {{ $now := Now }}
      {{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $lastTransitionTime | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
      addresses:
      - address: {{ NodeIP | Quote }}
        type: InternalIP
      - address: {{ .metadata.name | Quote }}
        type: Hostname
      {{ with index .metadata.annotations "kwok.ce-k8s.io/kubelet-port" }}
      daemonEndpoints:
        kubeletEndpoint:
          Port: {{ . }}
      {{ end }}
"""

# How long a pod's main containers run: the explicit annotation, else the `run=` word of the
# emulator's scenario annotation (ce_k8s.sim.k8s_scenario) times the bed's time scale, so the
# demo's pilots play the same lives on kwok as on the kubelet simulator.
_RUN_SECONDS_JQ = (
    '(.metadata.annotations // {}) as $a '
    '| ([($a["' + RUN_FOR + '"] // "") | capture("^(?<n>[0-9.]+)(?<u>ms|s|m|h)?$") | . + {"k": 1}] '
    '+ [($a["sim.ce-k8s.io/scenario"] // "") | (capture("(^| )oom-after=(?<n>[0-9.]+)(?<u>ms|s|m|h)?( |$)"), '
    'capture("(^| )run=(?<n>[0-9.]+)(?<u>ms|s|m|h)?( |$)")) | . + {"k": TIME_SCALE}]) '
    '| first | if . == null then empty '
    'else (.n | tonumber) * ({"ms": 0.001, "s": 1, "m": 60, "h": 3600}[.u // "s"]) * .k end')
# The pod ends on its own before its deadline (else the deadline stage takes it: the two never
# match the same pod, since kwok picks among matching weighted stages at random).
_ENDS_FIRST_JQ = '(' + _RUN_SECONDS_JQ + ') as $r | $r < (.spec.activeDeadlineSeconds // 1e18)'
_RUN_FOR_JQ = '(' + _RUN_SECONDS_JQ + ') | tostring + "s"'
_DEADLINE_FIRST_JQ = ('[' + _RUN_SECONDS_JQ + '] as $r | .spec.activeDeadlineSeconds != null '
                      'and (($r | length) == 0 or $r[0] >= .spec.activeDeadlineSeconds)')
# Whether the image cannot be pulled: the annotation, the scenario's `image-pull-error` word or the
# emulator's image-name convention (ce_k8s.sim.k8s_scenario.scenario_from_image).
_PULL_ERROR_JQ = (
    '((.metadata.annotations // {}) as $a | ($a["' + PULL_ERROR + '"] == "true") '
    'or (($a["sim.ce-k8s.io/scenario"] // "") | test("(^| )image-pull-error( |$)")) '
    'or ([.spec.containers[].image | test("does-not-exist|pull-error")] | any))')


def stages(time_scale: float = 0.05) -> str:
    """The Stage documents for kwok's --config, with the emulator's time scale for scenario runs."""
    return _STAGES.replace("TIME_SCALE", repr(float(time_scale)))


_STAGES = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: cek8s-node-initialize
spec:
  resourceRef: {{apiGroup: v1, kind: Node}}
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
  next:
    statusTemplate: |
{_NODE_STATUS}
      allocatable:
      {{{{ YAML .status.allocatable 1 }}}}
      capacity:
      {{{{ YAML .status.capacity 1 }}}}
      nodeInfo:
        architecture: amd64
        bootID: ""
        containerRuntimeVersion: {{{{ printf "kwok-%s" Version }}}}
        kernelVersion: {{{{ printf "kwok-%s" Version }}}}
        kubeProxyVersion: {{{{ printf "kwok-%s" Version }}}}
        kubeletVersion: {{{{ printf "kwok-%s" Version }}}}
        machineID: ""
        operatingSystem: linux
        osImage: ""
        systemUUID: ""
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: cek8s-node-heartbeat
spec:
  resourceRef: {{apiGroup: v1, kind: Node}}
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values: ['True']
  delay:
    durationMilliseconds: 20000
    jitterDurationMilliseconds: 25000
  next:
    statusTemplate: |
{_NODE_STATUS}
  immediateNextStage: true
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: cek8s-pod-pull-error
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
    - key: '{_PULL_ERROR_JQ}'
      operator: 'In'
      values: ['true']
    - key: '.status.conditions.[] | select( .type == "Initialized" ) | .reason'
      operator: 'NotIn'
      values: ['ContainersNotInitialized', 'ContainersNotReady']
  weight: 10
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $inits := .spec.initContainers }}}}
      conditions:
      - {{type: PodReadyToStartContainers, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      {{{{ if $inits }}}}
      - {{type: Initialized, status: "False", reason: ContainersNotInitialized, lastTransitionTime: {{{{ $now | Quote }}}},
         message: {{{{ printf "containers with incomplete status: [%s]" (index $inits 0).name | Quote }}}}}}
      {{{{ else }}}}
      - {{type: Initialized, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      {{{{ end }}}}
      - {{type: Ready, status: "False", reason: ContainersNotReady, lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: ContainersReady, status: "False", reason: ContainersNotReady, lastTransitionTime: {{{{ $now | Quote }}}}}}
      {{{{ if $inits }}}}
      initContainerStatuses:
      {{{{ range $i, $c := $inits }}}}
      - name: {{{{ $c.name | Quote }}}}
        image: {{{{ $c.image | Quote }}}}
        imageID: ""
        ready: false
        restartCount: 0
        started: false
        state:
          waiting:
            {{{{ if eq $i 0 }}}}
            reason: ImagePullBackOff
            message: {{{{ printf "Back-off pulling image %q: ErrImagePull: failed to pull and unpack image" $c.image | Quote }}}}
            {{{{ else }}}}
            reason: PodInitializing
            {{{{ end }}}}
      {{{{ end }}}}
      {{{{ end }}}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - name: {{{{ .name | Quote }}}}
        image: {{{{ .image | Quote }}}}
        imageID: ""
        ready: false
        restartCount: 0
        started: false
        state:
          waiting:
            {{{{ if $inits }}}}
            reason: PodInitializing
            {{{{ else }}}}
            reason: ImagePullBackOff
            message: {{{{ printf "Back-off pulling image %q: ErrImagePull: failed to pull and unpack image" .image | Quote }}}}
            {{{{ end }}}}
      {{{{ end }}}}
      hostIP: {{{{ NodeIPWith .spec.nodeName | Quote }}}}
      hostIPs: [{{{{ printf "{{ip: %q}}" (NodeIPWith .spec.nodeName) }}}}]
      phase: Pending
      startTime: {{{{ $now | Quote }}}}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: cek8s-pod-ready
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
    - key: '.spec.nodeName'
      operator: 'Exists'
    - key: '{_PULL_ERROR_JQ}'
      operator: 'NotIn'
      values: ['true']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      conditions:
      - {{type: PodReadyToStartContainers, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: Initialized, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: Ready, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: ContainersReady, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - name: {{{{ .name | Quote }}}}
        image: {{{{ .image | Quote }}}}
        imageID: {{{{ printf "%s@sha256:0000000000000000000000000000000000000000000000000000000000000000" .image | Quote }}}}
        containerID: {{{{ printf "containerd://%s" .name | Quote }}}}
        ready: true
        started: true
        restartCount: 0
        state:
          running:
            startedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      {{{{ with .spec.initContainers }}}}
      initContainerStatuses:
      {{{{ range . }}}}
      - name: {{{{ .name | Quote }}}}
        image: {{{{ .image | Quote }}}}
        imageID: ""
        ready: true
        started: false
        restartCount: 0
        state:
          terminated: {{exitCode: 0, reason: Completed, startedAt: {{{{ $now | Quote }}}}, finishedAt: {{{{ $now | Quote }}}}}}
      {{{{ end }}}}
      {{{{ end }}}}
      hostIP: {{{{ NodeIPWith .spec.nodeName | Quote }}}}
      hostIPs: [{{{{ printf "{{ip: %q}}" (NodeIPWith .spec.nodeName) }}}}]
      podIP: {{{{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}}}
      phase: Running
      startTime: {{{{ $now | Quote }}}}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: cek8s-pod-finish
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '{_ENDS_FIRST_JQ}'
      operator: 'In'
      values: ['true']
  weight: 5
  delay:
    durationMilliseconds: 1000
    durationFrom:
      expressionFrom: '{_RUN_FOR_JQ}'
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $a := or .metadata.annotations dict }}}}
      {{{{ $scenario := index $a "sim.ce-k8s.io/scenario" | default "" }}}}
      {{{{ $found := regexFind "(^| )exit=[0-9]+" $scenario }}}}
      {{{{ $said := regexReplaceAll ".*exit=" $found "" }}}}
      {{{{ $oom := regexMatch "(^| )oom-after=" $scenario }}}}
      {{{{ $code := or (index $a "{EXIT_CODE}") (ternary "137" "" $oom) $said "0" | atoi }}}}
      {{{{ $reason := or (index $a "{REASON}") (ternary "OOMKilled" "" $oom) (ternary "Completed" "Error" (eq $code 0)) }}}}
      {{{{ $started := $now }}}}
      {{{{ range .status.containerStatuses }}}}{{{{ with .state.running }}}}{{{{ $started = .startedAt }}}}{{{{ end }}}}{{{{ end }}}}
      conditions:
      - {{type: PodReadyToStartContainers, status: "False", lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: Initialized, status: "True", lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: Ready, status: "False", reason: PodCompleted, lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: ContainersReady, status: "False", reason: PodCompleted, lastTransitionTime: {{{{ $now | Quote }}}}}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - name: {{{{ .name | Quote }}}}
        image: {{{{ .image | Quote }}}}
        imageID: {{{{ printf "%s@sha256:0000000000000000000000000000000000000000000000000000000000000000" .image | Quote }}}}
        containerID: {{{{ printf "containerd://%s" .name | Quote }}}}
        ready: false
        started: false
        restartCount: 0
        state:
          terminated:
            exitCode: {{{{ $code }}}}
            reason: {{{{ $reason | Quote }}}}
            startedAt: {{{{ $started | Quote }}}}
            finishedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      phase: {{{{ ternary "Succeeded" "Failed" (eq $code 0) }}}}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: cek8s-pod-deadline
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '{_DEADLINE_FIRST_JQ}'
      operator: 'In'
      values: ['true']
  weight: 5
  delay:
    durationMilliseconds: 1000000000
    durationFrom:
      expressionFrom: '.spec.activeDeadlineSeconds | tostring | . + "s"'
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $started := $now }}}}
      {{{{ range .status.containerStatuses }}}}{{{{ with .state.running }}}}{{{{ $started = .startedAt }}}}{{{{ end }}}}{{{{ end }}}}
      conditions:
      - {{type: Ready, status: "False", reason: PodFailed, lastTransitionTime: {{{{ $now | Quote }}}}}}
      - {{type: ContainersReady, status: "False", reason: PodFailed, lastTransitionTime: {{{{ $now | Quote }}}}}}
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - name: {{{{ .name | Quote }}}}
        image: {{{{ .image | Quote }}}}
        imageID: ""
        ready: false
        started: false
        restartCount: 0
        state:
          terminated: {{exitCode: 137, reason: Error, startedAt: {{{{ $started | Quote }}}}, finishedAt: {{{{ $now | Quote }}}}}}
      {{{{ end }}}}
      message: {{{{ printf "Pod was active on the node longer than the specified deadline" | Quote }}}}
      reason: DeadlineExceeded
      phase: Failed
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: cek8s-pod-delete
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  next:
    delete: true
"""
