"""HTCJob on the real systems: the real kube-apiserver (ce_k8s.real.kube.kube) and the real HTCondor
bed with its batch pool (ce_k8s.real.condor.condor, `batch=True`: a schedd whose jobs a real startd runs),
with `ce-k8s htcjob-operator` as a real process between them. The tests of
tests/real/test_htcjob_condor.py and `ce-k8s demo htcjob` drive it.

The operator runs as a site runs it: the CRD, namespace and RBAC of containers/k8s/htcjob applied
with kubectl, the operator on a TokenRequest token of its own ServiceAccount (never admin), the
site's schedd named by collector and Name, and an IDTOKEN (HTCondor's own `condor_token_create`
in the root) in a 0600 file, as the Deployment mounts it from a Secret. Its work directory is one
path that outlives a killed operator's process, as the Deployment's emptyDir outlives a container
restart (a pod's replacement gets a new one: tests/real/test_htcjob_kube.py covers that).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ce_k8s.real.condor.condor import RealCondor
from ce_k8s.real.kube.kube import RealKube

MANIFESTS = ("crd.yaml", "namespace.yaml", "rbac.yaml")
OPERATOR_SA = ("ce-k8s-system", "ce-k8s-htcjob-operator")
USER_NAMESPACE = "htc-users"
GROUP_VERSION = "ce-k8s.io/v1alpha1"


def htcjob_manifests() -> Path:
    """containers/k8s/htcjob of this checkout, or of the installed share (pyproject data-files)."""
    here = Path(__file__).resolve().parents[2] / "containers" / "k8s" / "htcjob"
    return here if here.is_dir() else Path(sys.prefix) / "share" / "ce-k8s" / "containers" / "k8s" / "htcjob"


class HTCJobBed:
    """The operator between a real control plane that is up and a real HTCondor bed that is up."""

    def __init__(self, kube: RealKube, condor: RealCondor, work: Path) -> None:
        if not condor.batch:
            raise ValueError("the HTCJob bed needs the real HTCondor's batch pool (RealCondor(batch=True))")
        self.kube = kube
        self.condor = condor
        self.work = Path(work)
        self.operator: subprocess.Popen | None = None
        self.starts = 0
        self.namespace = USER_NAMESPACE

    # ------------------------------------------------------------------ set-up
    def prepare(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name in MANIFESTS:
            self.kube.kubectl("apply", "--server-side", "-f", str(htcjob_manifests() / name))
        self.kube.kubectl("wait", "--for=condition=Established", "crd/htcjobs.ce-k8s.io", "--timeout=60s")
        self.kube.service_account_kubeconfig(*OPERATOR_SA, self.kubeconfig)
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.condor.batch_token() + "\n")

    def use_namespace(self, name: str) -> None:
        """A fresh user namespace, bound for the operator as a site binds each one (rbac.yaml)."""
        self.kube.kubectl("create", "namespace", name)
        self.kube.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
        self.kube.kubectl("create", "rolebinding", "ce-k8s-htcjob-operator", "-n", name,
                          "--clusterrole=ce-k8s-htcjob-operator-namespace",
                          f"--serviceaccount={OPERATOR_SA[0]}:{OPERATOR_SA[1]}")
        self.namespace = name

    @property
    def kubeconfig(self) -> Path:
        return self.work / "operator.kubeconfig"

    @property
    def token_file(self) -> Path:
        return self.work / "schedd.token"

    @property
    def log_file(self) -> Path:
        return self.work / "operator.log"

    # ------------------------------------------------------------------ the operator process
    def start_operator(self, namespace: str | None = None, poll: float = 1.0) -> None:
        """`ce-k8s htcjob-operator` as a process (what the Deployment runs), its log appended."""
        cmd = [str(Path(sys.prefix) / "bin" / "ce-k8s"), "htcjob-operator", "--kubeconfig", str(self.kubeconfig),
               "--collector", self.condor.collector_address, "--schedd", self.condor.batch_name,
               "--token-file", str(self.token_file), "--work-dir", str(self.work / "operator"),
               "--claims-root", str(self.work / "claims"), "--poll", str(poll), "--upload-grace", "30"]
        if namespace:
            cmd += ["--namespace", namespace]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CONDOR_CONFIG": "/dev/null",
               "HOME": str(self.work), "PYTHONUNBUFFERED": "1"}
        with open(self.log_file, "a") as log:
            log.write(f"---- start {self.starts + 1}: {' '.join(cmd)}\n")
            log.flush()
            self.operator = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                             start_new_session=True)
        self.starts += 1

    def stop_operator(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        """Signal the operator (SIGKILL: killed mid-way, no clean-up); its exit status."""
        if self.operator is None:
            return None
        proc, self.operator = self.operator, None
        if proc.poll() is None:
            proc.send_signal(sig)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(10)

    def operator_log(self) -> str:
        try:
            return self.log_file.read_text()
        except OSError:
            return ""

    # ------------------------------------------------------------------ resources
    def apply(self, name: str, spec: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        namespace = namespace or self.namespace
        doc = {"apiVersion": GROUP_VERSION, "kind": "HTCJob", "metadata": {"name": name, "namespace": namespace},
               "spec": spec}
        path = self.work / f"htcjob-{namespace}-{name}.json"
        path.write_text(json.dumps(doc))
        self.kube.kubectl("apply", "-f", str(path))
        return self.get(name, namespace) or {}

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        namespace = namespace or self.namespace
        proc = self.kube.kubectl("get", "htcjob", name, "-n", namespace, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def row(self, name: str, namespace: str | None = None) -> str:
        """The `kubectl get htcjobs` line: what a user sees at a glance."""
        namespace = namespace or self.namespace
        return self.kube.kubectl("get", "htcjob", name, "-n", namespace, "--no-headers", check=False).stdout.strip()

    def output(self, name: str, namespace: str | None = None) -> dict[str, str]:
        namespace = namespace or self.namespace
        proc = self.kube.kubectl("get", "configmap", f"{name}-output", "-n", namespace, "-o", "json", check=False)
        return json.loads(proc.stdout).get("data") or {} if proc.returncode == 0 else {}

    def wait(self, name: str, predicate: Callable[[dict[str, Any]], Any], timeout: float, what: str,
             namespace: str | None = None, on_row: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Poll the resource until `predicate(obj)`; each new `kubectl get` row goes to `on_row`."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            obj = self.get(name, namespace)
            if on_row is not None:
                row = self.row(name, namespace)
                state = row.rsplit(None, 1)[0] if row else row     # the row without its AGE
                if row and state != last:
                    on_row(row)
                    last = state
            if obj is not None and predicate(obj):
                return obj
            if self.operator is not None and self.operator.poll() is not None:
                raise RuntimeError(f"the operator exited ({self.operator.returncode}): {self.operator_log()[-2000:]}")
            time.sleep(0.5)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}; status "
                           f"{json.dumps((self.get(name, namespace) or {}).get('status'))[:1500]}\n"
                           f"operator log: {self.operator_log()[-2000:]}")

    def jobs(self, uid: str, schedd: str | None = None) -> list[dict[str, Any]]:
        """The schedd's own record of a resource's jobs (queue and history), read in the root."""
        schedd = schedd or self.condor.batch_name
        attrs = ("ClusterId", "ProcId", "JobStatus", "ExitCode", "Owner", "HTCJobUid", "HTCJobAbandoned",
                 "RemoveReason", "NumJobStarts", "HoldReasonCode", "RoutedToJobId", "RoutedFromJobId")
        constraint = f'HTCJobUid == "{uid}"'
        # Each job once: one that leaves the queue between the two reads is in both (seen in a full
        # run: 4 "sources" for 2 jobs); its history record is the later one and wins.
        by_id: dict[tuple[Any, Any], dict[str, Any]] = {}
        for ad in (self.condor.query(constraint, attrs, schedd=schedd)
                   + self.condor.history(constraint, attrs, schedd=schedd)):
            by_id[(ad.get("ClusterId"), ad.get("ProcId"))] = ad
        return list(by_id.values())


def phase_is(*phases: str) -> Callable[[dict[str, Any]], bool]:
    return lambda obj: (obj.get("status") or {}).get("phase") in phases
