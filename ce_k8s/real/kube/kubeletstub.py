"""The smallest kubelet endpoint the real-Kubernetes bed needs: `/stats/summary` and `/containerLogs`.

kwok plays nodes and pod lifecycle but serves no Summary API at all, and its log endpoint reads one
static file for every pod, so neither ce-k8s's accounting (the kubelet's `/stats/summary`)
nor its finalize hook (`GET pods/{p}/log`) could be judged through the real API server. This stub
listens on each node's `daemonEndpoints.kubeletEndpoint.Port` (one HTTPS port a node, so a request
says which node it is for) and answers as a kubelet does, for the pods the real API server has
bound to that node:

* `/stats/summary`: stats/v1alpha1 `Summary` of the node's pods, **running containers only**.
  A real kubelet's stats come from the container's live cgroup (cAdvisor or CRI); once a container
  has exited, its stats are gone, so a "final read" after completion finds nothing (finding 6 of
  docs/real-kubernetes.md). CPU accrues from the container's `startedAt` at the rate of the pod's
  `sim.ce-k8s.io/usage` annotation (the emulator's grammar, ce_k8s.sim.kube.kubelet_stats).
* `/containerLogs/{ns}/{pod}/{container}`: the lines of the pod's `sim.ce-k8s.io/scenario`
  annotation (stdout and stderr interleaved, as a kubelet's CRI log serves them without the alpha
  split-streams gate), once the container has started; a waiting container answers 400 with the
  kubelet's words. `tailLines`, `limitBytes` and `timestamps` are honoured.

Everything else answers 404. The stub reads pods from the API server with the admin token of the
bed (`<state>/admin.kubeconfig`), per request: nothing is cached, so it can never disagree with the
server.

**Authentication and authorisation** as a kubelet with `--authentication-token-webhook`,
`--anonymous-auth=false` and `--authorization-mode=Webhook` (the usual setup) does them, so the
agent's direct read (CE_K8S_USAGE_SOURCE = kubelet) meets the real API server's RBAC: the bearer
token goes into a TokenReview, the user it names into a SubjectAccessReview for `nodes`, the node's
name, verb `get` and the subresource kubelet pkg/kubelet/server/auth.go derives from the path
(`/stats/*` -> `stats`, `/metrics/*` -> `metrics`, `/logs/*` -> `log`, anything else -> `proxy`),
both asked of the real API server with the bed's admin token. No token: 401; a token the API server
does not know: 401; a review that says no: 403 `Forbidden (user=..., verb=get, resource=nodes,
subresource(s)=[...])`, the words of the bed's real kubelet. `/containerLogs` is what the API server itself calls for
`pods/log` (with its kubelet client certificate on a cluster, with nothing in this bed): it is
served without a token, and checked like the rest when a token is presented. `/healthz` is open
(the bed's readiness probe).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ce_k8s.sim.kube.kubelet_stats import ContainerUsage, planned_usage
from ce_k8s.sim.kube.scenario import SCENARIO_ANNOTATION, ScenarioError, parse_scenario


def _ts(text: str | None) -> float | None:
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Api:
    """Plain GETs against the real API server with the bed's admin token."""

    def __init__(self, state: Path) -> None:
        conf = json.loads((state / "state.json").read_text())
        self.server = conf["server"]
        self.token = (state / "admin.token").read_text().strip()
        self.ctx = ssl.create_default_context(cafile=str(state / "apiserver" / "ca.crt"))

    def get(self, path: str) -> dict[str, Any]:
        req = urllib.request.Request(self.server + path, headers={"Authorization": f"Bearer {self.token}"})  # noqa: S310
        with urllib.request.urlopen(req, context=self.ctx, timeout=10) as resp:  # noqa: S310
            return json.load(resp)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(self.server + path, data=json.dumps(body).encode(), method="POST",  # noqa: S310
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=self.ctx, timeout=10) as resp:  # noqa: S310
            return json.load(resp)

    def authenticate(self, token: str) -> dict[str, Any] | None:
        """The user a bearer token is (TokenReview), or None when the API server does not know it."""
        review = self.post("/apis/authentication.k8s.io/v1/tokenreviews", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
        status = review.get("status") or {}
        return status.get("user") if status.get("authenticated") else None

    def authorize(self, user: dict[str, Any], node: str, subresource: str, verb: str = "get") -> bool:
        """Whether `user` may `verb` nodes/`subresource` of `node` (SubjectAccessReview)."""
        review = self.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user.get("username"), "uid": user.get("uid"), "groups": user.get("groups") or [],
                     "extra": user.get("extra") or {},
                     "resourceAttributes": {"verb": verb, "version": "v1", "resource": "nodes",
                                            "subresource": subresource, "name": node}}})
        return bool((review.get("status") or {}).get("allowed"))

    def pods_on(self, node: str) -> list[dict[str, Any]]:
        sel = urllib.parse.quote(f"spec.nodeName={node}")
        return self.get(f"/api/v1/pods?fieldSelector={sel}").get("items", [])


def subresources_of(path: str) -> list[str]:
    """The nodes subresources a kubelet authorises `path` as, any one of which allows it: /stats,
    /metrics and /logs their own; /configz, /healthz and /pods their own, then `proxy` (the
    fine-grained kubelet authorisation of 1.33+, on by default); anything else `proxy`. Read off the
    bed's real kubelet v1.37.2 (tests/real/test_real_node.py), which names them in its 403."""
    for prefix, subs in (("/stats", ["stats"]), ("/metrics", ["metrics"]), ("/logs", ["log"]),
                         ("/configz", ["configz", "proxy"]), ("/healthz", ["healthz", "proxy"]),
                         ("/pods", ["pods", "proxy"])):
        if path == prefix or path.startswith(prefix + "/"):
            return subs
    return ["proxy"]


def summary(node: str, pods: list[dict[str, Any]], started: float, now: float) -> dict[str, Any]:
    """The node's Summary: every pod with at least one running container, those containers only."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        specs = {c.get("name"): c for c in (pod.get("spec") or {}).get("containers") or []}
        meters = []
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            running = (cs.get("state") or {}).get("running")
            spec = specs.get(cs.get("name"))
            begun = _ts((running or {}).get("startedAt"))
            if running is None or spec is None or begun is None:
                continue
            cores, rss = planned_usage(pod, spec)
            meters.append(ContainerUsage(str(cs.get("name")), begun, cores, rss).stats(now))
        if not meters:
            continue
        cpu_ns = sum(m["cpu"]["usageCoreNanoSeconds"] for m in meters)
        rate = sum(m["cpu"]["usageNanoCores"] for m in meters)
        ws = sum(m["memory"]["workingSetBytes"] for m in meters)
        out.append({
            "podRef": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "startTime": (pod.get("status") or {}).get("startTime") or _rfc3339(now),
            "containers": meters,
            "cpu": {"time": _rfc3339(now), "usageNanoCores": rate, "usageCoreNanoSeconds": cpu_ns},
            "memory": {"time": _rfc3339(now), "usageBytes": ws, "workingSetBytes": ws,
                       "rssBytes": sum(m["memory"]["rssBytes"] for m in meters)},
        })
    return {"node": {"nodeName": node, "startTime": _rfc3339(started),
                     "cpu": {"time": _rfc3339(now),
                             "usageNanoCores": sum(p["cpu"]["usageNanoCores"] for p in out),
                             "usageCoreNanoSeconds": sum(p["cpu"]["usageCoreNanoSeconds"] for p in out)},
                     "systemContainers": []},
            "pods": out}


def container_log(pod: dict[str, Any], container: str, query: dict[str, list[str]]) -> tuple[int, bytes]:
    """(status, body) of `/containerLogs` for one container of `pod`, as the kubelet answers it."""
    status = None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            status = cs
    name = (pod.get("metadata") or {}).get("name")
    if status is None:
        return 400, f'container "{container}" in pod "{name}" is not available'.encode()
    state = status.get("state") or {}
    if "waiting" in state:
        reason = state["waiting"].get("reason") or "ContainerCreating"
        # The kubelet's words for the two pull failures (validateContainerLogStatus).
        reason = {"ErrImagePull": "image can't be pulled",
                  "ImagePullBackOff": "trying and failing to pull image"}.get(reason, reason)
        return 400, f'container "{container}" in pod "{name}" is waiting to start: {reason}'.encode()
    begun = _ts((state.get("running") or state.get("terminated") or {}).get("startedAt")) or time.time()
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(SCENARIO_ANNOTATION) or ""
    try:
        lines = [line for _stream, out in parse_scenario(text).output for line in out.splitlines()]
    except ScenarioError:
        lines = []
    if "tailLines" in query:
        n = int(query["tailLines"][0])
        lines = lines[-n:] if n > 0 else []
    if query.get("timestamps", ["false"])[0] == "true":
        stamp = dt.datetime.fromtimestamp(begun, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
        lines = [f"{stamp} {line}" for line in lines]
    body = "".join(line + "\n" for line in lines).encode()
    if "limitBytes" in query:
        body = body[: int(query["limitBytes"][0])]
    return 200, body


def serve(state: Path) -> None:
    conf = json.loads((state / "state.json").read_text())
    api = Api(state)
    started = time.time()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(state / "pki" / "kubelet.crt"), str(state / "pki" / "kubelet.key"))

    def handler_for(node: str) -> type[BaseHTTPRequestHandler]:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: object) -> None:  # one line a request, to the log
                print(f"{node}: {fmt % args}", flush=True)

            def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _authorized(self, path: str, required: bool) -> bool:
                """Authenticate and authorise as a webhook-mode kubelet; False when it answered."""
                header = self.headers.get("Authorization") or ""
                token = header[7:].strip() if header[:7].lower() == "bearer " else ""
                if not token:
                    if required:
                        self._send(401, b"Unauthorized")
                    return not required
                user = api.authenticate(token)
                if user is None:
                    self._send(401, b"Unauthorized")
                    return False
                subs = subresources_of(path)
                if not any(api.authorize(user, node, sub) for sub in subs):
                    self._send(403, (f"Forbidden (user={user.get('username')}, verb=get, resource=nodes, "
                                     f"subresource(s)=[{' '.join(subs)}])\n").encode())
                    return False
                return True

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                parts = [p for p in url.path.split("/") if p]
                try:
                    if parts != ["healthz"] and not self._authorized(url.path, parts[:1] != ["containerLogs"]):
                        return
                    if parts == ["healthz"]:
                        self._send(200, b"ok")
                    elif parts[:2] == ["stats", "summary"]:
                        doc = summary(node, api.pods_on(node), started, time.time())
                        self._send(200, json.dumps(doc).encode(), "application/json")
                    elif len(parts) == 4 and parts[0] == "containerLogs":
                        pod = api.get(f"/api/v1/namespaces/{parts[1]}/pods/{parts[2]}")
                        if (pod.get("spec") or {}).get("nodeName") != node:
                            self._send(404, b"pod not found on this node")
                            return
                        code, body = container_log(pod, parts[3], urllib.parse.parse_qs(url.query))
                        self._send(code, body)
                    else:
                        self._send(404, b"404 page not found")
                except urllib.error.HTTPError as e:
                    self._send(404 if e.code == 404 else 500, f"API server answered {e.code}".encode())
        return Handler

    threads = []
    for node, port in conf["node_ports"].items():
        httpd = ThreadingHTTPServer(("127.0.0.1", port), handler_for(node))
        httpd.daemon_threads = True
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
        t = threading.Thread(target=httpd.serve_forever, name=f"kubelet-{node}", daemon=True)
        t.start()
        threads.append(t)
    print(f"kubelet stub serving {len(threads)} nodes", flush=True)
    for t in threads:
        t.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", required=True, type=Path)
    serve(parser.parse_args().state)


if __name__ == "__main__":
    main()
