"""Raw JSON calls to the API server through the official `kubernetes` client.

Why not the typed API classes: the picker needs the same few verbs (list, watch, get, create, update) on core
objects, custom objects (namespaced or cluster-scoped) and Leases, and wants plain dicts without building model
objects for every pod event. `ApiClient` still does what matters: kubeconfig or in-cluster config, TLS, bearer
token (refreshed from the projected token file), proxies. Every method here BLOCKS: callers on the event loop run
them through `asyncio.to_thread`. The `kubernetes` package is imported on first use, not with this module: it
takes ~0.5 s to import, which a picker without a Kubernetes source (and every restart's readiness) should not pay.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ResourceRef:
    """One kind of object in one place: `namespace=None` means cluster-scoped (or every namespace)."""

    group: str  # "" for the core group (pods)
    version: str
    plural: str
    namespace: str | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection_path(self) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespace is not None:
            base += f"/namespaces/{self.namespace}"
        return f"{base}/{self.plural}"

    def item_path(self, name: str, subresource: str = "") -> str:
        path = f"{self.collection_path()}/{name}"
        return f"{path}/{subresource}" if subresource else path

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace is not None else ""
        return f"{self.plural}.{self.group or 'core'}/{self.version}{where}"


class ApiError(Exception):
    """A non-2xx answer; `status` 0 means no HTTP answer at all (connection refused, TLS failure)."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}: {body[:200]}" if body else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body


def load_api_client(kubeconfig: str | None = None) -> Any:
    """In-cluster config when running in a pod (and no kubeconfig given), else the kubeconfig (or $KUBECONFIG).

    Returns a `kubernetes.client.ApiClient`.
    """
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    configuration = k8s_client.Configuration()
    if kubeconfig:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(client_configuration=configuration)
    # urllib3's own retries would hide a dead API server behind long stalls; the watch loop retries with backoff.
    configuration.retries = False
    # Each watch holds a connection for minutes; leave room for lists and Lease renewals next to them.
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, 32)
    return k8s_client.ApiClient(configuration)


class KubeRest:
    """Blocking JSON requests; one instance per ApiClient (its connection pool is thread-safe)."""

    def __init__(self, api_client: Any, connect_timeout_s: float = 5.0) -> None:
        from kubernetes.client import ApiException

        self._api_exception = ApiException
        self._api = api_client
        self._connect_timeout_s = connect_timeout_s

    def open(
        self,
        method: str,
        path: str,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        read_timeout_s: float = 30.0,
        content_type: str = "application/json",
    ) -> Any:
        """Send a request and return the urllib3 response unread (for streams); raises ApiError on non-2xx."""
        params = [(k, ("true" if v else "false") if isinstance(v, bool) else v) for k, v in (query or {}).items()]
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        request = self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=params,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            answer = self._api.call_api(*request, _request_timeout=(self._connect_timeout_s, read_timeout_s))
        except self._api_exception as exc:
            raise ApiError(int(exc.status or 0), str(exc.reason or "error"), str(exc.body or "")) from None
        except Exception as exc:  # urllib3 errors: no answer from the server
            raise ApiError(0, type(exc).__name__, str(exc)) from None
        response = answer.response
        if not 200 <= response.status <= 299:
            text = response.data.decode("utf-8", "replace") if response.data else ""
            response.release_conn()
            raise ApiError(response.status, response.reason or "", text)
        return response

    def call(
        self,
        method: str,
        path: str,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        read_timeout_s: float = 30.0,
        content_type: str = "application/json",
    ) -> Obj:
        response = self.open(method, path, query, body, read_timeout_s, content_type)
        try:
            data = response.data
        except Exception as exc:
            raise ApiError(0, type(exc).__name__, str(exc)) from None
        finally:
            response.release_conn()
        try:
            decoded = json.loads(data) if data else {}
        except ValueError:
            raise ApiError(response.status, "response is not JSON", data[:200].decode("utf-8", "replace")) from None
        if not isinstance(decoded, dict):
            raise ApiError(response.status, "response is not a JSON object")
        return decoded


def iter_lines(response: Any, chunk_bytes: int = 65536) -> Iterator[bytes]:
    """Complete lines of a streamed (chunked) response as they arrive; blocking, bounded by the read timeout."""
    pending = b""
    for chunk in response.stream(chunk_bytes, decode_content=True):
        pending += chunk
        while True:
            newline = pending.find(b"\n")
            if newline < 0:
                break
            line, pending = pending[:newline], pending[newline + 1 :]
            if line.strip():
                yield line
    if pending.strip():
        yield pending
