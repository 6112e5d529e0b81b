"""Routed job ad + CE settings → the pilot's Pod and its sandbox Secret (pure: no I/O).

Why pure: the same function serves `ce-k8s route` (dry run, Secret redacted), the agent (real
files) and the tests, and a pure function is what makes "what `condor_ce_q -l` shows is what the
pod got" (docs/routes.md) checkable. Every unusable input raises `PodBuildError` with a
stable code (`ce_k8s.holds`), never anything else.

The rules, with their sources:
* resources (htcondor-ce.md §1.5 and the "Routing to pods" checklist): `RequestCpus` → cpu request,
  limit per `K8sCpuLimit`; `RequestMemory` (MB) → memory request = limit; `RequestDisk` (KiB) →
  ephemeral-storage request; `RequestGPUs` → the GPU resource, request = limit; `WantWholeNode` →
  the route's node shape `K8sWholeNode*`; wall time `BatchRuntime` (s), else `maxWallTime` (min),
  else `CE_K8S_DEFAULT_WALLTIME` (min) → `activeDeadlineSeconds`.
* what runs: the executable from the Secret, `Arguments`/`Args` split with HTCondor's own rules
  (`ce_k8s.condor.args`), exec form, every `$` doubled so Kubernetes' `$(VAR)` expansion cannot
  touch job text; never a shell.
* credentials (decision 6): proxy/token/inputs only in the Secret, mounted read-only, mode 0400,
  readable by the pilot's group through `fsGroup`; env vars name the files, never hold them.
* safety (decision 7): non-root, no privilege escalation, all capabilities dropped,
  RuntimeDefault seccomp, `restartPolicy: Never`, no service-account token unless the route asks;
  `K8sPodPatch` is applied last and may not loosen any of it.
"""

from __future__ import annotations

import base64
import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass

from ce_k8s.condor.args import ArgsError, job_args, job_env
from ce_k8s.pods import k8svalues as kv
from ce_k8s.pods.errors import PodBuildError
from ce_k8s.pods.jobad import JobAd
from ce_k8s.pods.names import label_value, pod_name, secret_name
from ce_k8s.pods.sandbox import SandboxItem, job_spool_dir, sandbox_plan

CONTAINER = "pilot"
LINKS_CONTAINER = "sandbox-links"
SANDBOX_VOLUME = "sandbox"
SCRATCH_VOLUME = "scratch"
SANDBOX_DIR = "/ce-k8s/sandbox"
SCRATCH_DIR = "/ce-k8s/scratch"
SECRET_DEFAULT_MODE = 0o400
LABEL_PREFIX = "ce-k8s.htcondor.org/"
MANAGED_BY = ("app.kubernetes.io/managed-by", "ce-k8s")
REDACTED = "<redacted>"

MAX_CPUS = 4096
MAX_MEMORY_MB = 64 * 1024 * 1024        # 64 TiB
MAX_DISK_KIB = 1024 ** 4                # 1 PiB
MAX_GPUS = 64
MAX_WALLTIME = 366 * 86400
DEFAULT_MEMORY_MB = 2000                # the CE's Memory transform default (htcondor-ce.md §1.5)


@dataclass(frozen=True)
class BuiltPod:
    """The manifests for one attempt of one job; `secret` is None when the job has no sandbox."""

    name: str
    namespace: str
    pod: dict
    secret: dict | None
    sandbox: tuple[SandboxItem, ...] = ()


def owner_reference(pod_name: str, pod_uid: str) -> dict:
    """The ownerReference the agent puts on the Secret once the pod exists (GC deletes it with the pod)."""
    return {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid}


def redact_secret(secret: dict | None) -> dict | None:
    """A copy of a Secret safe to print: every data value replaced by a placeholder with its size."""
    if secret is None:
        return None
    out = copy.deepcopy(secret)
    data = out.get("data") or {}
    for key, value in data.items():
        if value == REDACTED:
            continue
        try:
            size = len(base64.b64decode(value, validate=True))
            data[key] = f"<redacted {size} bytes>"
        except (ValueError, TypeError):
            data[key] = REDACTED
    return out


def build_manifests(
    ad: JobAd | Mapping[str, object],
    settings,
    files: Mapping[str, bytes] | None = None,
    *,
    attempt: int = 0,
) -> BuiltPod:
    """Build the Pod and Secret for `attempt` of the routed job `ad`; `files=None` is a dry run."""
    if not isinstance(ad, JobAd):
        ad = JobAd(ad)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 0 <= attempt <= 999_999:
        raise PodBuildError("bad-k8s-value", f"attempt must be an integer 0..999999, got {attempt!r}")
    return _Builder(ad, settings, files, attempt).build()


def security_contexts(user: int, group: int) -> tuple[dict, dict]:
    """(pod, container) securityContext of every pilot pod: the restricted PodSecurity profile,
    the pilot's uid, and its group as fsGroup so the Secret's files are readable by it. A function
    of its own so that the real-node tests run the pilot image under exactly this shape."""
    pod_sc = {
        "runAsNonRoot": True,
        "runAsUser": user,
        "runAsGroup": group,
        "fsGroup": group,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container_sc = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    return pod_sc, container_sc


class _Builder:
    def __init__(self, ad: JobAd, settings, files: Mapping[str, bytes] | None, attempt: int) -> None:
        self.ad = ad
        self.s = settings
        self.files = files
        self.attempt = attempt

    # -- identity ------------------------------------------------------------------------------

    def source_global_job_id(self) -> str | None:
        for attr in ("K8sSourceGlobalJobId", "GlobalJobId"):
            value = self.ad.get_str(attr, code="missing-job-id")
            if value:
                return value
        return None

    def name(self) -> str:
        given = self.ad.get_str("K8sPodName", code="missing-job-id")
        given_attempt = self.ad.get_int("K8sAttempt", 0, code="missing-job-id")
        if given and given_attempt == self.attempt:
            return kv.dns_label_attr("K8sPodName", given)
        gjid = self.source_global_job_id()
        if not gjid:
            raise PodBuildError("missing-job-id", "no K8sSourceGlobalJobId/GlobalJobId to name the pod after")
        return pod_name(gjid, self.attempt)

    def source_job_id(self) -> str:
        routed_from = self.ad.get_str("RoutedFromJobId", code="missing-job-id")
        if routed_from:
            return routed_from
        cluster = self.ad.get_int("ClusterId", code="missing-job-id")
        proc = self.ad.get_int("ProcId", code="missing-job-id")
        return f"{cluster}.{proc}" if cluster is not None and proc is not None else ""

    def labels(self) -> dict[str, str]:
        extra = self.ad.get_dict("K8sLabels")
        labels: dict[str, str] = {}
        if extra:
            for key, value in kv.string_map("K8sLabels", extra, label_values=False).items():
                labels[key] = label_value(value)
        owner = self.ad.get_str("Owner", code="bad-k8s-value") or ""
        ours = {
            MANAGED_BY[0]: MANAGED_BY[1],
            LABEL_PREFIX + "ce": label_value(self.s.ce_name),
            LABEL_PREFIX + "route": label_value(self.ad.get_str("RouteName") or ""),
            LABEL_PREFIX + "job": label_value(self.source_job_id()),
            LABEL_PREFIX + "owner": label_value(owner),
            LABEL_PREFIX + "attempt": str(self.attempt),
        }
        labels.update(ours)  # ours win: the agent finds its pods by these
        return labels

    def annotations(self) -> dict[str, str]:
        extra = self.ad.get_dict("K8sAnnotations")
        notes: dict[str, str] = {}
        if extra:
            notes.update(kv.string_map("K8sAnnotations", extra, label_values=False))
        ours: dict[str, str] = {}
        gjid = self.source_global_job_id()
        if gjid:
            ours["global-job-id"] = gjid
        for key, attrs in (
            ("routed-from", ("RoutedFromJobId",)),
            ("owner", ("Owner",)),
            ("credential-subject", ("orig_AuthTokenSubject", "AuthTokenSubject", "x509userproxysubject")),
            ("credential-issuer", ("orig_AuthTokenIssuer", "AuthTokenIssuer", "X509UserProxyVOName")),
        ):
            for attr in attrs:
                value = self.ad.get(attr)
                if isinstance(value, str) and value:
                    ours[key] = value
                    break
        for key, value in ours.items():
            notes[LABEL_PREFIX + key] = kv.one_line(value)
        if sum(len(k) + len(v) for k, v in notes.items()) > 256 * 1024:
            raise PodBuildError("bad-k8s-value", "K8sAnnotations exceed Kubernetes' 256 KiB annotation limit")
        return notes

    # -- resources ---------------------------------------------------------------------------------

    def _number(self, attr: str, code: str, default: float | None, low: float, high: float,
                integral: bool = False) -> float | None:
        value = self.ad.get_number(attr, None, code=code)
        if value is None:
            return default
        if integral and not float(value).is_integer():
            raise PodBuildError(code, f"{attr} = {value!r} must be a whole number")
        if not low <= value <= high:
            raise PodBuildError(code, f"{attr} = {value!r} is outside {low:g}..{high:g}")
        return value

    def resources(self) -> dict[str, dict[str, str]]:
        whole = self.ad.get_bool("WantWholeNode", False, code="bad-whole-node")
        if whole:
            cpus = self._number("K8sWholeNodeCpus", "bad-whole-node", None, 1, MAX_CPUS)
            memory = self._number("K8sWholeNodeMemory", "bad-whole-node", None, 1, MAX_MEMORY_MB)
            gpus = self._number("K8sWholeNodeGpus", "bad-whole-node", 0, 0, MAX_GPUS, integral=True)
            if cpus is None or memory is None:
                raise PodBuildError(
                    "bad-whole-node", "the route sets no node shape (K8sWholeNodeCpus and K8sWholeNodeMemory)"
                )
        else:
            cpus = self._number("RequestCpus", "bad-request-cpus", 1, 0.001, MAX_CPUS)
            memory = self._number("RequestMemory", "bad-request-memory", DEFAULT_MEMORY_MB, 1, MAX_MEMORY_MB)
            gpus = self._number("RequestGPUs", "bad-request-gpus", 0, 0, MAX_GPUS, integral=True)
        disk = self._number("RequestDisk", "bad-request-disk", 0, 0, MAX_DISK_KIB)

        millicores = kv.to_millicores(cpus)
        mem = f"{math.ceil(memory)}Mi"
        requests = {"cpu": kv.cpu_quantity(millicores), "memory": mem}
        limits = {"memory": mem}
        policy_text = self.ad.get_str("K8sCpuLimit") or self.s.cpu_limit
        try:
            factor = kv.parse_cpu_limit(policy_text)
        except ValueError:
            raise PodBuildError(
                "bad-k8s-value", f"K8sCpuLimit = {policy_text[:40]!r} must be 'request', 'none' or a factor 1..64"
            ) from None
        if factor is not None:
            limits["cpu"] = kv.cpu_quantity(math.ceil(millicores * factor))
        if disk:
            requests["ephemeral-storage"] = f"{math.ceil(disk)}Ki"
        if gpus:
            gpu_resource = self.ad.get_str("K8sGpuResource") or self.s.gpu_resource
            if "/" not in gpu_resource or not kv.is_qualified_name(gpu_resource):
                raise PodBuildError("bad-k8s-value", f"K8sGpuResource = {gpu_resource[:60]!r} is not a resource name")
            requests[gpu_resource] = limits[gpu_resource] = str(int(gpus))
        return {"requests": requests, "limits": limits}

    def walltime(self) -> int:
        runtime = self._number("BatchRuntime", "bad-walltime", None, 1, MAX_WALLTIME)
        if runtime is not None:
            return math.ceil(runtime)
        minutes = self._number("maxWallTime", "bad-walltime", None, 1 / 60, MAX_WALLTIME / 60)
        if minutes is None:
            minutes = self.s.default_walltime
        return min(MAX_WALLTIME, math.ceil(minutes * 60))

    # -- what runs ---------------------------------------------------------------------------------

    def command(self, items: list[SandboxItem]) -> tuple[list[str], list[str]]:
        exe = next((i for i in items if i.role == "executable"), None)
        if exe is not None:
            command = [f"{SANDBOX_DIR}/{exe.key}"]
        else:
            cmd = self.ad.get_str("Cmd", code="missing-executable")
            if not cmd or not cmd.startswith("/"):
                raise PodBuildError(
                    "missing-executable",
                    "TransferExecutable is false, so Cmd must be an absolute path inside the image",
                )
            if not kv.is_clean_text(cmd):
                raise PodBuildError("missing-executable", "Cmd contains a NUL byte or invalid UTF-8")
            command = [cmd]
        try:
            args = job_args(
                self.ad.get_str("Arguments", code="bad-arguments"), self.ad.get_str("Args", code="bad-arguments")
            )
        except ArgsError as exc:
            raise PodBuildError("bad-arguments", str(exc)) from None
        if not all(kv.is_clean_text(a) for a in args):
            raise PodBuildError("bad-arguments", "an argument contains a NUL byte or invalid UTF-8")
        return [kv.escape_dollar(c) for c in command], [kv.escape_dollar(a) for a in args]

    def env(self, items: list[SandboxItem]) -> list[dict]:
        values: dict[str, str] = {}
        if self.s.collector_host and not self.s.disable_pilot_ads:
            values["CONDORCE_COLLECTOR_HOST"] = self.s.collector_host
        try:
            values.update(
                job_env(
                    self.ad.get_str("Environment", code="bad-environment"),
                    self.ad.get_str("Env", code="bad-environment"),
                    self.ad.get_str("EnvDelim", code="bad-environment"),
                )
            )
        except ArgsError as exc:
            raise PodBuildError("bad-environment", str(exc)) from None
        # The job's environment names files by their CE spool path (e.g. IDTOKENS_FILE), which does
        # not exist in the pod; the same files are linked into the scratch directory.
        spool_prefix = job_spool_dir(self.ad, self.s.spool).rstrip("/") + "/"
        values = {name: value.replace(spool_prefix, SCRATCH_DIR + "/") for name, value in values.items()}
        values.update(self.s.pilot_env)
        route_env = self.ad.get_dict("K8sEnv")
        for name, raw in (route_env or {}).items():
            if isinstance(raw, bool):
                raw = "true" if raw else "false"
            if not isinstance(raw, str | int | float):
                raise PodBuildError("bad-k8s-value", f"K8sEnv.{name} must be a string or number")
            values[name] = str(raw)
        values.setdefault("TMPDIR", SCRATCH_DIR)
        values.setdefault("OSG_WN_TMP", SCRATCH_DIR)
        values.setdefault("HOME", SCRATCH_DIR)
        for item in items:
            if item.role == "x509":
                values["X509_USER_PROXY"] = f"{SANDBOX_DIR}/{item.key}"
            elif item.role == "token":
                values["BEARER_TOKEN_FILE"] = f"{SANDBOX_DIR}/{item.key}"
        downward = {
            "CE_K8S_POD_NAME": "metadata.name",
            "CE_K8S_POD_NAMESPACE": "metadata.namespace",
            "CE_K8S_NODE_NAME": "spec.nodeName",
        }
        # The pod's own wall-time limit (`activeDeadlineSeconds`, which the downward API does not
        # give): a pilot plans its retirement by it (ce_k8s.pilot, GLIDEIN_ToDie). Ours, like the
        # downward values: neither the job nor the route can make it say something else.
        ours = {"CE_K8S_DEADLINE_SECONDS": str(self.walltime())}
        out: list[dict] = []
        for name, value in values.items():
            if name in downward or name in ours:
                continue
            if not kv.is_env_name(name):
                raise PodBuildError("bad-environment", f"{name[:60]!r} is not a valid environment variable name")
            if not kv.is_clean_text(value):
                raise PodBuildError("bad-environment", f"the value of {name} contains a NUL byte or invalid UTF-8")
            out.append({"name": name, "value": kv.escape_dollar(value)})
        out += [{"name": name, "value": value} for name, value in ours.items()]
        for name, path in downward.items():
            out.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}})
        return out

    # -- the manifests -----------------------------------------------------------------------------

    def security_contexts(self) -> tuple[dict, dict]:
        return security_contexts(self.s.run_as_user, self.s.run_as_group)

    def secret(self, name: str, namespace: str, labels: dict, items: list[SandboxItem]) -> dict | None:
        if not items:
            return None
        data: dict[str, str] = {}
        if self.files is None:
            data = {item.key: REDACTED for item in items}
        else:
            total = 0
            for item in items:
                content = self.files.get(item.key)
                if content is None:
                    raise PodBuildError("sandbox-file-missing", f"{item.path} ({item.role}) was not read")
                if not isinstance(content, bytes | bytearray):
                    raise PodBuildError("sandbox-file-missing", f"{item.path}: contents must be bytes")
                total += len(content)
                if total > self.s.secret_max_bytes:
                    raise PodBuildError(
                        "sandbox-too-large",
                        f"the sandbox files exceed CE_K8S_SECRET_MAX_BYTES = {self.s.secret_max_bytes} bytes "
                        f"(at {item.path})",
                    )
                data[item.key] = base64.b64encode(bytes(content)).decode("ascii")
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": secret_name(name),
                "namespace": namespace,
                "labels": {k: labels[k] for k in labels if k == MANAGED_BY[0] or k.startswith(LABEL_PREFIX)},
            },
            "data": data,
        }

    def build(self) -> BuiltPod:
        ad, s = self.ad, self.s
        name = self.name()
        namespace = kv.dns_label_attr("K8sNamespace", ad.get_str("K8sNamespace") or s.namespace)
        image = ad.get_str("K8sImage", code="bad-image") or s.image
        if not image:
            raise PodBuildError("missing-image", "neither K8sImage nor CE_K8S_IMAGE is set")
        image = kv.image_attr(image)
        pull = ad.get_str("K8sImagePullPolicy") or s.image_pull_policy
        if pull not in ("Always", "IfNotPresent", "Never"):
            raise PodBuildError("bad-k8s-value", f"K8sImagePullPolicy = {pull[:40]!r} is not Always/IfNotPresent/Never")

        items = sandbox_plan(ad, s)
        labels = self.labels()
        annotations = self.annotations()
        command, args = self.command(items)
        env = self.env(items)
        resources = self.resources()
        pod_sc, container_sc = self.security_contexts()

        mounts: list[dict] = [{"name": SCRATCH_VOLUME, "mountPath": SCRATCH_DIR}]
        volumes: list[dict] = [{"name": SCRATCH_VOLUME, "emptyDir": {}}]
        if items:
            mounts.insert(0, {"name": SANDBOX_VOLUME, "mountPath": SANDBOX_DIR, "readOnly": True})
            volumes.insert(0, {
                "name": SANDBOX_VOLUME,
                "secret": {
                    "secretName": secret_name(name),
                    "defaultMode": SECRET_DEFAULT_MODE,
                    "items": [{"key": i.key, "path": i.key, "mode": i.mode} for i in items],
                },
            })
        route_volumes = ad.get_str("K8sVolumes")
        if route_volumes:
            extra_vols, extra_mounts = kv.volumes(
                "K8sVolumes", route_volumes, {SANDBOX_VOLUME, SCRATCH_VOLUME}, {SANDBOX_DIR, SCRATCH_DIR, "/ce-k8s"}
            )
            volumes.extend(extra_vols)
            mounts.extend(extra_mounts)

        container = {
            "name": CONTAINER,
            "image": image,
            "imagePullPolicy": pull,
            "command": command,
            "args": args,
            "workingDir": SCRATCH_DIR,
            "env": env,
            "resources": resources,
            "securityContext": container_sc,
            "volumeMounts": mounts,
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
        spec: dict = {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": self.walltime(),
            "enableServiceLinks": False,
            "securityContext": pod_sc,
            "containers": [container],
            "volumes": volumes,
        }
        if items:
            spec["initContainers"] = [{
                "name": LINKS_CONTAINER,
                "image": image,
                "imagePullPolicy": pull,
                # POSIX `ln -s src... dir/`: puts the inputs where a batch job finds them, in its cwd,
                # as links so a refreshed proxy in the Secret is seen by the running pilot.
                "command": ["ln", "-s", "-f", "--", *[f"{SANDBOX_DIR}/{i.key}" for i in items], SCRATCH_DIR + "/"],
                "resources": copy.deepcopy(resources),
                "securityContext": copy.deepcopy(container_sc),
                "volumeMounts": copy.deepcopy(mounts[:2]),
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }]
        self.scheduling(spec)

        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
            "spec": spec,
        }
        patch = ad.get_str("K8sPodPatch")
        if patch:
            pod = self.apply_patch(pod, patch)
        secret = self.secret(name, namespace, labels, items)
        return BuiltPod(name, namespace, pod, secret, tuple(items))

    def scheduling(self, spec: dict) -> None:
        ad = self.ad
        account = ad.get_str("K8sServiceAccount")
        automount = ad.get_bool("K8sAutomountToken")
        if account:
            spec["serviceAccountName"] = kv.dns_subdomain_attr("K8sServiceAccount", account)
        spec["automountServiceAccountToken"] = bool(automount) if automount is not None else bool(account)
        for attr, field in (("K8sPriorityClass", "priorityClassName"), ("K8sRuntimeClass", "runtimeClassName")):
            value = ad.get_str(attr)
            if value:
                spec[field] = kv.dns_subdomain_attr(attr, value)
        selector = ad.get_dict("K8sNodeSelector")
        if selector:
            spec["nodeSelector"] = kv.string_map("K8sNodeSelector", selector, label_values=True)
        tolerations = ad.get_list("K8sTolerations")
        if tolerations:
            spec["tolerations"] = kv.tolerations("K8sTolerations", tolerations)
        affinity = ad.get_str("K8sAffinity")
        if affinity:
            spec["affinity"] = kv.affinity("K8sAffinity", affinity)

    def apply_patch(self, pod: dict, text: str) -> dict:
        import jsonpatch

        ops = kv.parse_json_attr("K8sPodPatch", text, "patch-failed")
        if not isinstance(ops, list) or not all(isinstance(op, dict) for op in ops):
            raise PodBuildError("patch-failed", "K8sPodPatch must be a JSON list of RFC 6902 operations")
        try:
            patched = jsonpatch.JsonPatch(ops).apply(pod, in_place=False)
        except Exception as exc:  # jsonpatch raises several unrelated types on bad input
            raise PodBuildError("patch-failed", f"{type(exc).__name__}: {exc}") from None
        if not isinstance(patched, dict) or patched.get("apiVersion") != "v1" or patched.get("kind") != "Pod":
            raise PodBuildError("patch-failed", "K8sPodPatch must leave a v1 Pod")
        meta = patched.get("metadata") if isinstance(patched.get("metadata"), dict) else {}
        labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
        ours = pod["metadata"]["labels"]
        if meta.get("name") != pod["metadata"]["name"] or meta.get("namespace") != pod["metadata"]["namespace"]:
            raise PodBuildError("patch-failed", "K8sPodPatch may not change the pod's name or namespace")
        if any(labels.get(k) != v for k, v in ours.items() if k == MANAGED_BY[0] or k.startswith(LABEL_PREFIX)):
            raise PodBuildError("patch-failed", "K8sPodPatch may not change ce-k8s's own labels")
        containers = patched.get("spec", {}).get("containers") if isinstance(patched.get("spec"), dict) else None
        if not isinstance(containers, list) or not any(
            isinstance(c, dict) and c.get("name") == CONTAINER for c in containers
        ):
            raise PodBuildError("patch-failed", f"K8sPodPatch may not remove the {CONTAINER!r} container")
        looser = kv.security_permissions(patched) - kv.security_permissions(pod)
        if looser:
            raise PodBuildError("patch-weakens-security", "it would allow " + ", ".join(sorted(looser)))
        return patched
