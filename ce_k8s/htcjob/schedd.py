"""The schedd an HTCJob goes to, through the htcondor2 bindings (a fake stands beside it in tests).

Why tokens go through `SEC_TOKEN_DIRECTORY`: the bindings take a token by value only for the
collector (`SecurityContext`); every schedd command authenticates from the process's
configuration. So each target's token is written to a directory of its own (0700, file 0600)
and the configuration points at it for the duration of one call, under one lock: the operator's
workers (ce_k8s.htcjob.operator) call schedds one at a time, so no call runs on another's token.

Every call that fails to reach or to authenticate raises `ScheddUnreachable`: the resource gets
a `ScheddReachable=False` condition and is tried again, never marked failed or resubmitted.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any, Protocol

from ce_k8s.htcjob.jobstate import ATTRS
from ce_k8s.htcjob.submitdesc import ABANDONED_ATTR, UID_ATTR

_PARAM_LOCK = threading.Lock()


class ScheddUnreachable(RuntimeError):
    """The schedd (or its collector) could not be reached, or refused us."""


class SubmitRefused(RuntimeError):
    """The schedd was reachable and refused the submit description: the spec is the problem (a
    `spec.submit` expression that does not parse, say), and submitting again would fail again."""


class Schedd(Protocol):
    """What the operator asks of a schedd; `HTCondorSchedd` and the tests' fake implement it."""

    name: str

    def jobs(self, uid: str, expected: int) -> list[dict[str, Any]]:
        """Every job ad carrying HTCJobUid == uid: the queue's, then the history's when the queue has
        fewer than `expected`; each with `_source` "queue" or "history"."""

    def submit(self, description: dict[str, str], count: int) -> int:
        """Submit `count` procs in one cluster and upload their input; return the cluster id."""

    def remove(self, constraint: str, reason: str) -> int:
        """condor_rm the jobs matching `constraint`; how many it acted on."""

    def retrieve(self, cluster: int) -> None:
        """Fetch the output sandboxes of a spooled cluster into the paths recorded at submit."""

    def edit(self, constraint: str, attr: str, value: str) -> None:
        """condor_qedit: set `attr` to the ClassAd expression `value`."""


def uid_constraint(uid: str) -> str:
    """The resource's own jobs: its uid, not given up, and not a job router's copy of one (a CE's
    router copies every attribute, HTCJobUid too, into the job it routes: those are the router's)."""
    return f'{UID_ATTR} == "{uid}" && {ABANDONED_ATTR} =!= true && RoutedFromJobId =?= undefined'


def _plain(ad) -> dict[str, Any]:
    """The projected attributes of a ClassAd as Python values (expressions and undefined dropped)."""
    out: dict[str, Any] = {}
    for key in ATTRS:
        if key not in ad:
            continue
        try:
            value = ad.eval(key)
        except Exception:               # an expression that does not evaluate: not a fact we read  # noqa: S112
            continue
        if isinstance(value, bool | int | float | str):
            out[key] = value
    return out


class HTCondorSchedd:
    """A schedd found through a collector (or the local configuration), optionally with a token."""

    def __init__(self, collector: str | None, schedd: str | None, token: str | None,
                 token_root: Path) -> None:
        self.collector = collector
        self.schedd_name = schedd
        self.token = token
        self.name = schedd or "(local schedd)"
        self._location = None
        self._token_dir: Path | None = None
        if token:
            digest = hashlib.sha256(token.encode()).hexdigest()[:16]
            self._token_dir = token_root / digest
            self._token_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self._token_dir, 0o700)
            path = self._token_dir / "token"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(token.strip() + "\n")

    def _call(self, what: str, fn):
        import htcondor2

        with _PARAM_LOCK:
            saved = {}
            if self._token_dir is not None:
                for key, value in (("SEC_TOKEN_DIRECTORY", str(self._token_dir)),
                                   ("SEC_CLIENT_AUTHENTICATION_METHODS", "IDTOKENS")):
                    saved[key] = htcondor2.param.get(key)
                    htcondor2.param[key] = value
            try:
                return fn(htcondor2, self._schedd(htcondor2))
            except ScheddUnreachable:
                raise
            except Exception as exc:     # the bindings raise HTCondorException or plain errors
                self._location = None    # locate again next time: the schedd may have moved
                raise ScheddUnreachable(f"{what} on {self.name}: {exc}") from exc
            finally:
                for key, value in saved.items():
                    if value is None:
                        del htcondor2.param[key]
                    else:
                        htcondor2.param[key] = value

    def _schedd(self, htcondor2):
        if self._location is None:
            security = htcondor2.SecurityContext(token=self.token.strip()) if self.token else None
            collector = htcondor2.Collector(self.collector, security) if self.collector else htcondor2.Collector()
            try:
                self._location = collector.locate(htcondor2.DaemonType.Schedd, self.schedd_name) \
                    if self.schedd_name else collector.locate(htcondor2.DaemonType.Schedd)
            except Exception as exc:
                raise ScheddUnreachable(f"locating schedd {self.name} in {self.collector or 'the local pool'}: "
                                        f"{exc}") from exc
        return htcondor2.Schedd(self._location)

    def jobs(self, uid: str, expected: int) -> list[dict[str, Any]]:
        constraint = uid_constraint(uid)

        def query(htcondor2, schedd):
            ads = [{**_plain(ad), "_source": "queue"} for ad in schedd.query(constraint, list(ATTRS))]
            if len(ads) < max(expected, 1):
                ads += [{**_plain(ad), "_source": "history"} for ad in schedd.history(constraint, list(ATTRS), -1)]
            return ads

        return self._call("query", query)

    def submit(self, description: dict[str, str], count: int) -> int:
        """Submit and upload. A submit that fails while the schedd still answers a query was
        refused for its description (SubmitRefused); one that fails with the schedd gone is
        ScheddUnreachable. An upload that fails leaves a cluster held for its input, which the
        next pass finds by uid (ce_k8s.htcjob.reconcile)."""
        def submit(htcondor2, schedd):
            try:
                result = schedd.submit(htcondor2.Submit(description), count=count, spool=True)
            except Exception as exc:
                try:
                    schedd.query("false", ["ClusterId"], limit=1)
                except Exception:
                    raise exc from None          # the schedd is gone: unreachable, try again
                raise SubmitRefused(f"the schedd {self.name} refused the submit description: "
                                    f"{str(exc).strip()}") from exc
            schedd.spool(result)
            return int(result.cluster())

        try:
            return self._call("submit", submit)
        except ScheddUnreachable as exc:
            if isinstance(exc.__cause__, SubmitRefused):
                raise exc.__cause__ from None
            raise

    def remove(self, constraint: str, reason: str) -> int:
        def remove(htcondor2, schedd):
            # A tuple: htcondor2 25.14's act() drops a reason given as a plain string (it reads
            # only a (text, code) tuple and sends "Python-initiated action" otherwise; measured:
            # no RemoveReason in the history).
            result = schedd.act(htcondor2.JobAction.Remove, constraint, (reason, 0))
            return int(result.get("TotalSuccess", 0)) if result is not None else 0

        return self._call("remove", remove)

    def retrieve(self, cluster: int) -> None:
        self._call("retrieve", lambda htcondor2, schedd: schedd.retrieve(f"ClusterId == {int(cluster)}"))

    def edit(self, constraint: str, attr: str, value: str) -> None:
        self._call("edit", lambda htcondor2, schedd: schedd.edit(constraint, attr, value))
