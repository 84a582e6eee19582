"""A fake Kubernetes API server on loopback that speaks the real wire protocol.

The real `kubernetes` client (and anything else that speaks HTTP/JSON to an API server) talks to it through a
generated kubeconfig (`write_kubeconfig`). It implements what the picker and its tests need, for objects of any
group/version/plural, namespaced or cluster-scoped:

- list with `resourceVersion` in `metadata`, `labelSelector` (k=v,…) and `fieldSelector` (metadata.name/namespace);
- watch as a chunked stream of JSON lines: ADDED/MODIFIED/DELETED, BOOKMARK (with `allowWatchBookmarks`), ERROR
  with a 410 Status when the requested resourceVersion is older than the compacted history, `timeoutSeconds`;
- get/create/update (409 on a stale `metadata.resourceVersion`, 409 AlreadyExists)/merge-patch/delete, and the
  status subresource (`…/{name}/status`: update touches status only, the main resource ignores status);
- a bearer-token check (401 otherwise);
- fault injection: `drop_watches()` cuts every open watch mid-stream; `hold_watches()`/`release_watches()` make
  new watch requests wait (a partition); `freeze_watches()` keeps streams open but silent (a dead stream only an
  inactivity timeout notices); `compact()` forgets history so resuming from an old resourceVersion gets 410;
  `always_gone()` answers every watch with 410, even one from the resourceVersion the list just gave (a broken
  watch cache); `go_away()`/`come_back()` refuse every request with 503 (an API server outage).
- TokenReview (authentication.k8s.io/v1) and SubjectAccessReview (authorization.k8s.io/v1), as `--metrics-endpoint-auth`
  uses them: `review_tokens` maps a bearer token to its user (name, groups), `allow_non_resource` holds the
  (user, verb, path) triples that are authorized; anything else is unauthenticated or denied.
- `calls`: every API call it served as (verb, path), verbs in RBAC's words (get, list, watch, create, update,
  patch, delete), for checking the manifests' RBAC against what the code really does.

The server runs its own event loop in a daemon thread, so sync and async tests (and other processes) can use it;
every public method is thread-safe and returns once the change is applied and its watch events are queued.

Usage::

    with FakeApiServer() as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        api.apply(pod("vllm-0", ip="127.10.0.7"))
        api.delete("v1", "Pod", "default", "vllm-0")
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml
from aiohttp import web

T = TypeVar("T")
Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Resource:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


DEFAULT_RESOURCES = (
    Resource("", "v1", "pods", "Pod"),
    Resource("coordination.k8s.io", "v1", "leases", "Lease", status_subresource=False),
    Resource("inference.networking.k8s.io", "v1", "inferencepools", "InferencePool"),
    Resource("inference.networking.x-k8s.io", "v1alpha2", "inferenceobjectives", "InferenceObjective"),
    Resource("inference.networking.x-k8s.io", "v1alpha2", "inferencemodelrewrites", "InferenceModelRewrite"),
    Resource("llm-d.ai", "v1alpha2", "inferenceobjectives", "InferenceObjective"),
    Resource("llm-d.ai", "v1alpha2", "inferencemodelrewrites", "InferenceModelRewrite"),
)


@dataclass(frozen=True, slots=True)
class Call:
    verb: str  # RBAC verb
    path: str  # without the query


@dataclass(slots=True)
class _Watcher:
    resource: Resource
    namespace: str | None
    labels: dict[str, str]
    fields: dict[str, str]
    bookmarks: bool
    queue: asyncio.Queue[Obj | None] = field(default_factory=asyncio.Queue)
    frozen: bool = False
    request: web.Request | None = None

    def matches(self, obj: Obj) -> bool:
        meta = obj.get("metadata", {})
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        labels = meta.get("labels") or {}
        if any(labels.get(k) != v for k, v in self.labels.items()):
            return False
        return _fields_match(self.fields, meta)


_REVIEWS = (
    "/apis/authentication.k8s.io/v1/tokenreviews",
    "/apis/authorization.k8s.io/v1/subjectaccessreviews",
)


def _status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _fields_match(fields: Mapping[str, str], meta: Mapping[str, Any]) -> bool:
    for key, value in fields.items():
        if key == "metadata.name" and meta.get("name") != value:
            return False
        if key == "metadata.namespace" and meta.get("namespace") != value:
            return False
    return True


def _parse_selector(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        out[key.strip()] = value.lstrip("=").strip()
    return out


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeApiServer:
    """See the module docstring. `start()`/`stop()` or use as a context manager."""

    def __init__(
        self,
        token: str = "fake-token",
        resources: tuple[Resource, ...] = DEFAULT_RESOURCES,
        bookmark_interval_s: float | None = None,
    ) -> None:
        self.token = token
        self.bookmark_interval_s = bookmark_interval_s
        self.calls: list[Call] = []
        self.rejected = 0  # requests refused for a missing or wrong bearer token
        self.review_tokens: dict[str, tuple[str, list[str]]] = {}  # TokenReview: token → (username, groups)
        self.allow_non_resource: set[tuple[str, str, str]] = set()  # SubjectAccessReview: (user, verb, path)
        self._resources: dict[tuple[str, str, str], Resource] = {}
        self._by_kind: dict[tuple[str, str], Resource] = {}
        for res in resources:
            self.register(res)
        self._objects: dict[tuple[str, str, str], dict[tuple[str, str], Obj]] = {}
        self._history: dict[tuple[str, str, str], list[tuple[int, str, Obj]]] = {}
        self._rv = itertools.count(1000)
        self._current_rv = 999
        self._compacted_rv = 0
        self._watchers: list[_Watcher] = []
        self._held: asyncio.Event | None = None
        self._always_gone = False
        self._away = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- lifecycle --------------------------------------------------------------------------------------------

    def register(self, res: Resource) -> None:
        self._resources[(res.group, res.version, res.plural)] = res
        self._by_kind[(res.api_version, res.kind)] = res

    def start(self) -> FakeApiServer:
        started = threading.Event()
        errors: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve())
            except BaseException as exc:  # reported to start()
                errors.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            # A watch whose client left (aiohttp does not cancel its handler) may still wait on its queue: end it
            # here, or closing the loop leaves a pending Queue.get that warns at garbage collection.
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=main, name="fake-apiserver", daemon=True)
        self._thread.start()
        started.wait(10)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path, namespace: str = "default", token: str | None = None) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "picker", "user": {"token": token if token is not None else self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "picker", "namespace": namespace}}],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _shutdown(self) -> None:
        for w in self._watchers:
            w.queue.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()

    def _call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the server loop and wait for it: all state lives on that loop."""
        assert self._loop is not None, "start() the server first"

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    # -- the test's backdoor (thread-safe) ----------------------------------------------------------------------

    def apply(self, obj: Obj) -> Obj:
        """Create or replace an object as-is (status included), like a controller or kubelet would; returns it."""
        return self._call(lambda: self._put(self._resource_of(obj), copy.deepcopy(obj)))

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        res = self._by_kind[(api_version, kind)]
        return self._call(lambda: self._remove(res, namespace or "", name) is not None)

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        res = self._by_kind[(api_version, kind)]
        found = self._call(lambda: self._store(res).get((namespace or "", name)))
        return copy.deepcopy(found) if found is not None else None

    def list(self, api_version: str, kind: str) -> list[Obj]:
        res = self._by_kind[(api_version, kind)]
        return self._call(lambda: copy.deepcopy(list(self._store(res).values())))

    def drop_watches(self) -> int:
        """Cut every open watch stream mid-chunk, as a broken connection would; returns how many."""

        def drop() -> int:
            dropped = 0
            for w in list(self._watchers):
                if w.request is not None and w.request.transport is not None:
                    w.request.transport.abort()
                    dropped += 1
                w.queue.put_nowait(None)
            self._watchers.clear()
            return dropped

        return self._call(drop)

    def freeze_watches(self) -> None:
        """Open streams stay connected but deliver nothing more (only an inactivity timeout notices)."""

        def freeze() -> None:
            for w in self._watchers:
                w.frozen = True

        self._call(freeze)

    def hold_watches(self) -> None:
        """New watch requests wait (a partition) until `release_watches()`."""

        def hold() -> None:
            self._held = asyncio.Event()

        self._call(hold)

    def release_watches(self) -> None:
        def release() -> None:
            if self._held is not None:
                self._held.set()
                self._held = None

        self._call(release)

    def always_gone(self, on: bool = True) -> None:
        """Every watch from now on gets an ERROR 410 event at once, whatever resourceVersion it asks for."""
        self._always_gone = on

    def go_away(self) -> None:
        """An outage: every request (lease renewals included) gets 503 until `come_back()`; open watches end."""
        self._away = True
        self.drop_watches()

    def come_back(self) -> None:
        self._away = False

    def compact(self) -> int:
        """Forget all history: a watch resuming from any resourceVersion seen so far gets 410 Gone."""

        def compact() -> int:
            self._compacted_rv = self._current_rv
            for history in self._history.values():
                history.clear()
            return self._compacted_rv

        return self._call(compact)

    def send_bookmarks(self) -> None:
        self._call(self._bookmark_all)

    def open_watches(self) -> int:
        return self._call(lambda: len(self._watchers))

    # -- the store (server loop only) ---------------------------------------------------------------------------

    def _resource_of(self, obj: Mapping[str, Any]) -> Resource:
        key = (str(obj.get("apiVersion")), str(obj.get("kind")))
        if key not in self._by_kind:
            raise KeyError(f"no resource registered for {key}")
        return self._by_kind[key]

    def _store(self, res: Resource) -> dict[tuple[str, str], Obj]:
        return self._objects.setdefault((res.group, res.version, res.plural), {})

    def _next_rv(self) -> str:
        self._current_rv = next(self._rv)
        return str(self._current_rv)

    def _put(self, res: Resource, obj: Obj) -> Obj:
        meta = obj.setdefault("metadata", {})
        namespace = meta.get("namespace", "default") if res.namespaced else ""
        if res.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        key = (namespace, meta["name"])
        store = self._store(res)
        old = store.get(key)
        if old is None:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            meta["generation"] = 1
        else:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            changed_spec = old.get("spec") != obj.get("spec")
            meta["generation"] = old["metadata"].get("generation", 1) + (1 if changed_spec else 0)
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        meta["resourceVersion"] = self._next_rv()
        store[key] = obj
        self._publish(res, "ADDED" if old is None else "MODIFIED", obj, old)
        return copy.deepcopy(obj)

    def _remove(self, res: Resource, namespace: str, name: str) -> Obj | None:
        obj = self._store(res).pop((namespace if res.namespaced else "", name), None)
        if obj is not None:
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._publish(res, "DELETED", obj)
        return obj

    def _publish(self, res: Resource, kind: str, obj: Obj, old: Obj | None = None) -> None:
        """Queue the event for every watcher it concerns. As the real API server's watch cache does for a selector
        watch, a change that takes an object out of the selection reaches the watcher as DELETED, and one that
        brings it in as ADDED."""
        rv = int(obj["metadata"]["resourceVersion"])
        snapshot = copy.deepcopy(obj)
        self._history.setdefault((res.group, res.version, res.plural), []).append((rv, kind, snapshot))
        event = {"type": kind, "object": snapshot}
        for w in self._watchers:
            if w.resource != res or w.frozen:
                continue
            now = w.matches(snapshot)
            before = old is not None and w.matches(old)
            if kind == "MODIFIED" and before != now:
                w.queue.put_nowait({"type": "ADDED" if now else "DELETED", "object": snapshot})
            elif now:
                w.queue.put_nowait(event)

    def _bookmark_all(self) -> None:
        for w in self._watchers:
            if w.bookmarks and not w.frozen:
                w.queue.put_nowait(self._bookmark(w.resource))

    def _bookmark(self, res: Resource) -> Obj:
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": res.kind,
                "apiVersion": res.api_version,
                "metadata": {"resourceVersion": str(self._current_rv)},
            },
        }

    # -- HTTP ---------------------------------------------------------------------------------------------------

    def _route(self, path: str) -> tuple[Resource, str | None, str | None, str | None] | None:
        """(resource, namespace, name, subresource) for an API path, or None."""
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            return None
        res = self._resources.get((group, version, rest[0]))
        if res is None:
            return None
        name = rest[1] if len(rest) >= 2 else None
        sub = rest[2] if len(rest) == 3 else None
        return res, namespace, name, sub

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self._away:
            return web.json_response(_status(503, "ServiceUnavailable", "the API server is unavailable"), status=503)
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            self.rejected += 1
            return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)
        route = self._route(request.path)
        query = request.query
        watching = query.get("watch") in ("true", "1")
        method = request.method
        verb = {
            "GET": "watch" if watching else "get",
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete",
        }.get(method, method.lower())
        if route is not None and route[2] is None and verb == "get":
            verb = "list"
        self.calls.append(Call(verb, request.path))
        if method == "POST" and request.path in _REVIEWS:
            return web.json_response(self._review(request.path, await request.json()), status=201)
        if route is None:
            return web.json_response(_status(404, "NotFound", f"the server could not find {request.path}"), status=404)
        res, namespace, name, sub = route
        if sub is not None and (sub != "status" or not res.status_subresource):
            return web.json_response(_status(404, "NotFound", f"no subresource {sub}"), status=404)
        if verb == "watch":
            return await self._watch(request, res, namespace)
        if verb == "list":
            return self._list(res, namespace, query)
        body: Obj | None = None
        if method in ("POST", "PUT", "PATCH"):
            try:
                body = json.loads(await request.text())
            except ValueError:
                return web.json_response(_status(400, "BadRequest", "body is not JSON"), status=400)
            if not isinstance(body, dict):
                return web.json_response(_status(400, "BadRequest", "body is not an object"), status=400)
        status, payload = self._mutate(method, res, namespace or "", name, sub, body, request.content_type)
        return web.json_response(payload, status=status)

    def _review(self, path: str, body: Obj) -> Obj:
        """A TokenReview or SubjectAccessReview answered from `review_tokens` / `allow_non_resource`."""
        spec = body.get("spec") or {}
        if path == _REVIEWS[0]:
            user = self.review_tokens.get(str(spec.get("token", "")))
            status: Obj = {"authenticated": False, "error": "invalid bearer token"}
            if user is not None:
                status = {"authenticated": True, "user": {"username": user[0], "groups": list(user[1])}}
        else:
            attrs = spec.get("nonResourceAttributes") or {}
            allowed = (spec.get("user"), attrs.get("verb"), attrs.get("path")) in self.allow_non_resource
            status = {"allowed": allowed} if allowed else {"allowed": False, "reason": "no RBAC rule allows it"}
        return {**body, "status": status}

    def _list(self, res: Resource, namespace: str | None, query: Mapping[str, str]) -> web.Response:
        labels = _parse_selector(query.get("labelSelector", ""))
        fields = _parse_selector(query.get("fieldSelector", ""))
        probe = _Watcher(res, namespace, labels, fields, False)
        items = [copy.deepcopy(o) for o in self._store(res).values() if probe.matches(o)]
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return web.json_response(
            {
                "kind": f"{res.kind}List",
                "apiVersion": res.api_version,
                "metadata": {"resourceVersion": str(self._current_rv)},
                "items": items,
            }
        )

    def _mutate(
        self,
        method: str,
        res: Resource,
        namespace: str,
        name: str | None,
        sub: str | None,
        body: Obj | None,
        content_type: str,
    ) -> tuple[int, Obj]:
        store = self._store(res)
        ns = namespace if res.namespaced else ""
        if method == "POST":
            assert body is not None
            meta = body.setdefault("metadata", {})
            if name is not None or not meta.get("name"):
                return 400, _status(400, "BadRequest", "create needs metadata.name on the collection path")
            if res.namespaced:
                meta["namespace"] = ns
            if (ns, meta["name"]) in store:
                return 409, _status(409, "AlreadyExists", f'{res.plural} "{meta["name"]}" already exists')
            meta.pop("resourceVersion", None)
            if res.status_subresource:
                body.pop("status", None)
            return 201, self._put(res, body)
        if name is None:
            return 405, _status(405, "MethodNotAllowed", f"{method} on a collection")
        current = store.get((ns, name))
        if current is None:
            return 404, _status(404, "NotFound", f'{res.plural} "{name}" not found')
        if method == "GET":
            return 200, copy.deepcopy(current)
        if method == "DELETE":
            removed = self._remove(res, ns, name)
            return 200, copy.deepcopy(removed or {})
        assert body is not None
        if method == "PATCH":
            if "json-patch" in content_type:
                return 415, _status(415, "UnsupportedMediaType", "only merge patches are supported")
            body = _merge_patch(current, body)
            assert isinstance(body, dict)
        else:
            wanted_rv = body.get("metadata", {}).get("resourceVersion")
            if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
                return 409, _status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {res.plural} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                )
        updated = copy.deepcopy(current)
        if sub == "status":
            updated["status"] = body.get("status")
        else:
            updated["spec"] = body.get("spec")
            for key, value in body.items():
                if key not in ("metadata", "status", "spec", "apiVersion", "kind"):
                    updated[key] = value
            meta = body.get("metadata", {})
            for key in ("labels", "annotations"):
                if key in meta:
                    updated["metadata"][key] = meta[key]
            if not res.status_subresource and "status" in body:
                updated["status"] = body["status"]
        if updated == current and method == "PATCH":
            return 200, copy.deepcopy(current)
        return 200, self._put(res, updated)

    async def _watch(self, request: web.Request, res: Resource, namespace: str | None) -> web.StreamResponse:
        if self._held is not None:
            await self._held.wait()
        query = request.query
        watcher = _Watcher(
            res,
            namespace,
            _parse_selector(query.get("labelSelector", "")),
            _parse_selector(query.get("fieldSelector", "")),
            query.get("allowWatchBookmarks") in ("true", "1"),
            request=request,
        )
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        rv_text = query.get("resourceVersion", "")
        try:
            since = int(rv_text) if rv_text not in ("", "0") else None
        except ValueError:
            since = -1
        if self._always_gone or (since is not None and (since < self._compacted_rv or since < 0)):
            gone = _status(410, "Expired", f"too old resource version: {rv_text} ({self._compacted_rv})")
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            await response.write_eof()
            return response
        if since is None:
            backlog = [{"type": "ADDED", "object": copy.deepcopy(o)} for o in self._store(res).values()]
        else:
            history = self._history.get((res.group, res.version, res.plural), [])
            backlog = [{"type": t, "object": o} for rv, t, o in history if rv > since]
        for event in backlog:
            if watcher.matches(event["object"]):
                watcher.queue.put_nowait(event)
        self._watchers.append(watcher)
        timeout = float(query.get("timeoutSeconds", "0") or 0) or None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        try:
            while True:
                wait = self.bookmark_interval_s
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    wait = min(wait, left) if wait else left
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if self.bookmark_interval_s and watcher.bookmarks and not watcher.frozen:
                        event = self._bookmark(res)
                    else:
                        continue
                if event is None:
                    break
                if watcher.frozen:
                    continue
                await response.write(json.dumps(event).encode() + b"\n")
            if request.transport is not None and not request.transport.is_closing():
                await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            if watcher in self._watchers:
                self._watchers.remove(watcher)
        return response
