"""The kwok Stages that play a kubelet's pod and node lifecycle in the real-Kubernetes test bed.

kwok drops its built-in stages as soon as any Stage is configured, and its default pod stages never
finish a bare Pod (only Job-owned ones), so the bed ships its own set. A pod's life is read from
its annotations: the emulator's scenario (`sim.ce-k8s.io/scenario`, the grammar of
ce_k8s.sim.kube.scenario: the words `run=`, `exit=`, `oom-after=` and `image-pull-error`, and the
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
in the ``kwok.ce-k8s.io/kubelet-port`` annotation (the bed's kubelet stub, ce_k8s/real/kube/kubeletstub.py).

The Stages themselves are data: ``kwokstages.yaml`` beside this module, one multi-document file as
kwok's ``--config`` reads it, so it reads as the Stages a kwok user writes. This module fills in its
``${name}`` placeholders: the pieces more than one Stage uses and the one computed value, the time
scale.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources

RUN_FOR = "kwok.ce-k8s.io/run-for"
EXIT_CODE = "kwok.ce-k8s.io/exit-code"
REASON = "kwok.ce-k8s.io/reason"
PULL_ERROR = "kwok.ce-k8s.io/pull-error"
KUBELET_PORT = "kwok.ce-k8s.io/kubelet-port"
MANAGED_LABEL = "kwok.ce-k8s.io/managed"   # kwok manages the nodes labelled "true"

# Read with importlib.resources, so the file is found where the package is installed (a wheel ships
# it as package data: pyproject.toml), not beside a checkout.
_DATA_FILE = "kwokstages.yaml"
# `${name}` only: the Go templates and jq expressions in the file name their variables `$name`.
_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")

# The status both node Stages write: conditions, addresses and the kubelet endpoint the bed's stub
# listens on. Its lines after the first take the indent of its placeholder in the file.
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
{{ end }}"""

# Whether the image cannot be pulled: the annotation, the scenario's `image-pull-error` word or the
# emulator's image-name convention (ce_k8s.sim.kube.scenario.scenario_from_image).
_PULL_ERROR_JQ = (
    '((.metadata.annotations // {}) as $a | ($a["' + PULL_ERROR + '"] == "true") '
    'or (($a["sim.ce-k8s.io/scenario"] // "") | test("(^| )image-pull-error( |$)")) '
    'or ([.spec.containers[].image | test("does-not-exist|pull-error")] | any))')


def _run_seconds_jq(time_scale: float) -> str:
    """How long a pod's main containers run, in seconds (nothing: until deleted).

    The explicit annotation as written, else the `run=` (or `oom-after=`) word of the emulator's
    scenario annotation (ce_k8s.sim.kube.scenario) times the bed's time scale, so the demo's pilots
    play the same lives on kwok as on the kubelet simulator.
    """
    return (
        '(.metadata.annotations // {}) as $a '
        '| ([($a["' + RUN_FOR + '"] // "") | capture("^(?<n>[0-9.]+)(?<u>ms|s|m|h)?$") | . + {"k": 1}] '
        '+ [($a["sim.ce-k8s.io/scenario"] // "") '
        '| (capture("(^| )oom-after=(?<n>[0-9.]+)(?<u>ms|s|m|h)?( |$)"), '
        'capture("(^| )run=(?<n>[0-9.]+)(?<u>ms|s|m|h)?( |$)")) | . + {"k": ' + repr(float(time_scale)) + '}]) '
        '| first | if . == null then empty '
        'else (.n | tonumber) * ({"ms": 0.001, "s": 1, "m": 60, "h": 3600}[.u // "s"]) * .k end')


def stages(time_scale: float = 0.05) -> str:
    """The Stage documents for kwok's --config, with the emulator's time scale for scenario runs."""
    return _fill(_documents(), {"node_status": _NODE_STATUS, "pull_error": _PULL_ERROR_JQ,
                                "run_seconds": _run_seconds_jq(time_scale)})


def _documents() -> str:
    """The Stage documents of the data file, without its header (comments for its reader, up to `---`)."""
    text = resources.files("ce_k8s.real.kube").joinpath(_DATA_FILE).read_text(encoding="utf-8")
    header, sep, documents = text.partition("\n---\n")
    if not sep or not all(line.startswith("#") for line in header.splitlines()):
        raise ValueError(f"{_DATA_FILE}: expected a header of comments, then `---` and the Stages")
    return documents


def _fill(text: str, values: Mapping[str, str]) -> str:
    """`text` with each `${name}` replaced by `values[name]` (a name it lacks is a KeyError: a typo).

    A value's lines after its first are indented as the placeholder's line is, so a block of
    several lines lands inside the YAML block scalar that holds the placeholder.
    """
    def one(match: re.Match[str]) -> str:
        before = text[text.rfind("\n", 0, match.start()) + 1:match.start()]   # its line, up to it
        indent = before[:len(before) - len(before.lstrip(" "))]
        return values[match.group(1)].replace("\n", "\n" + indent)

    return _PLACEHOLDER.sub(one, text)
