"""The agent's per-pilot API calls, sent through the official client's generic request path.

Why not the typed methods (`CoreV1Api.create_namespaced_pod` ...): since kubernetes 35 each of
them validates its arguments with pydantic, turns a plain-dict body into a `V1Pod` model and
then serialises the model back to a dict before sending. That is about 700 µs of CPU per pod
create and 200 µs per delete (docs/performance.md), for bodies the agent already builds as
plain, schema-checked dicts and answers it reads with `_preload_content=False`.

These four calls go through `ApiClient.param_serialize` and `ApiClient.call_api`, the public
methods every typed method ends in: the same URL, query, `Accept` header, bearer-token auth,
TLS, timeouts and connection pool, and the same `ApiException` for a non-2xx answer (what the
typed methods raise with `_preload_content=False`). `tests/agent/test_corecalls.py` checks that
each request serialises exactly as the typed method's does, so a client upgrade that changes the
typed path fails there first. The signatures are the typed methods' subset the agent uses, so
`CoreCalls` stands in for `CoreV1Api` at these call sites.

Every answer is read to its end before it is returned. An unread raw response keeps its
connection out of the pool until it is garbage-collected, so the next request opens a new one
(a TCP and, on a real cluster, a TLS handshake): the pipeline benchmark counted two per pilot,
for the delete and the Secret create whose answers nobody read.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

_JSON = "application/json"
_AUTH = ["BearerToken"]


def drained(raw: Any) -> Any:
    """``raw`` (a urllib3 response) read to its end and kept: ``.data`` still answers, and the
    connection is back in the pool (module docstring)."""
    raw.read(cache_content=True)
    return raw


def _raw_only(preload_content: bool) -> None:
    if preload_content:
        raise TypeError("CoreCalls returns the raw response only: pass _preload_content=False")


class CoreCalls:
    """create pod, create Secret, delete pod, read pod log: the calls made for every pilot."""

    def __init__(self, api_client: ApiClient) -> None:
        self.api_client = api_client

    def request(self, method: str, path: str, path_params: dict[str, str],
                query: list[tuple[str, Any]] | None = None, body: dict | None = None,
                _request_timeout: Any = None) -> Any:
        """One request; the raw urllib3 response, already read, on 2xx; `ApiException` otherwise."""
        serialized = self.api_client.param_serialize(
            method=method, resource_path=path, path_params=path_params, query_params=query or [],
            header_params={"Accept": _JSON}, body=body, post_params=[], files={}, auth_settings=_AUTH,
            collection_formats={})
        resp = self.api_client.call_api(*serialized, _request_timeout=_request_timeout)
        if not 200 <= resp.status <= 299:
            resp.read()
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
        return drained(resp.response)

    def create_namespaced_pod(self, namespace: str, body: dict, dry_run: str | None = None,
                              _preload_content: bool = False, _request_timeout: Any = None) -> Any:
        _raw_only(_preload_content)
        query = [("dryRun", dry_run)] if dry_run is not None else []
        return self.request("POST", "/api/v1/namespaces/{namespace}/pods", {"namespace": namespace}, query,
                            body, _request_timeout)

    def create_namespaced_secret(self, namespace: str, body: dict, _preload_content: bool = False,
                                 _request_timeout: Any = None) -> Any:
        _raw_only(_preload_content)
        return self.request("POST", "/api/v1/namespaces/{namespace}/secrets", {"namespace": namespace}, None,
                            body, _request_timeout)

    def delete_namespaced_pod(self, name: str, namespace: str, propagation_policy: str | None = None,
                              _preload_content: bool = False, _request_timeout: Any = None) -> Any:
        _raw_only(_preload_content)
        query = [("propagationPolicy", propagation_policy)] if propagation_policy is not None else []
        return self.request("DELETE", "/api/v1/namespaces/{namespace}/pods/{name}",
                            {"name": name, "namespace": namespace}, query, None, _request_timeout)

    def read_namespaced_pod_log(self, name: str, namespace: str, container: str | None = None,
                                limit_bytes: int | None = None, stream: str | None = None,
                                _preload_content: bool = False, _request_timeout: Any = None) -> Any:
        _raw_only(_preload_content)
        # The typed method's query order: container, ..., limitBytes, ..., stream.
        query = [(k, v) for k, v in (("container", container), ("limitBytes", limit_bytes), ("stream", stream))
                 if v is not None]
        return self.request("GET", "/api/v1/namespaces/{namespace}/pods/{name}/log",
                            {"name": name, "namespace": namespace}, query, None, _request_timeout)
