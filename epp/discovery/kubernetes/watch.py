"""List-then-watch of any Kubernetes collection, with the recovery rules a long-lived watcher needs.

API (for every feeder that follows objects in a cluster: pods, InferencePools, objectives, FederatedClusters …)::

    rest = KubeRest(load_api_client(kubeconfig))
    ref = ResourceRef("federation.llmkube.dev", "v1alpha1", "federatedclusters")     # cluster-scoped
    ref = ResourceRef("", "v1", "pods", namespace="default")                          # namespaced
    async for item in watch_objects(rest, ref, WatchOptions(field_selector="metadata.name=x")):
        match item:
            case Listed(objects=objs):   # a COMPLETE view: reconcile to exactly these (removals included)
                ...
            case Changed(type=t, object=obj):   # t in ADDED / MODIFIED / DELETED, obj a plain dict
                ...

`ObjectCache` folds that stream into the current set of objects, keyed by (namespace, name), for consumers that
simply want "what exists now" after each item.

Recovery rules (kopf's, client-go's reflector's):
- list, then watch from the list's resourceVersion with `allowWatchBookmarks`; every event and bookmark advances
  the resourceVersion to resume from;
- the stream ends (server `timeoutSeconds`, dropped connection, protocol error) → watch again from the last
  resourceVersion, without re-listing (after a short backoff when it ended in an error);
- 410 Gone (as the HTTP status or as an ERROR event) → the history is compacted: list again; the consumer gets a
  new `Listed` and reconciles, so objects deleted in the gap disappear. A 410 again right after that list (no
  event or bookmark in between) means the server cannot serve a watch from its own list: the next lists back off
  (exponential with jitter, capped at `backoff_max_s`) and the log says so once per `log_every_s`, not per call;
- a stream that ends within a second with nothing in it is treated as failed (backoff), not resumed at once;
- an ERROR event of another kind, or a failed list → backoff (exponential with jitter, capped) then list again;
- 404 on the list (the CRD is not installed) → an empty `Listed` with `served=False` once, then retry slowly
  (a consumer that must tell "no objects" from "no such type", as the objectives' group choice does, reads it);
- no byte for `inactivity_timeout_s` (the socket read timeout) → the stream is presumed dead and is reopened.

Every blocking client call runs in a worker thread, never on the event loop: the list through `asyncio.to_thread`
(short, bounded by its timeout), the stream reads in a thread of the watch's own, because a watch blocks a thread
for minutes and a few watches would otherwise take every thread of the loop's default executor, starving the
short calls (Lease renewals!) queued behind them. Cancelling the
consuming task shuts the open socket down, so no worker thread is left blocked in a read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal

from epp.discovery.kubernetes.rest import ApiError, KubeRest, Obj, ResourceRef, iter_lines
from epp.observability.ratelimit import RateLimitedLog

log = logging.getLogger(__name__)

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
_INSTANT_END_S = 1.0  # a stream that ends this soon with nothing in it counts as failed (backoff)


@dataclass(frozen=True, slots=True)
class WatchOptions:
    label_selector: str = ""
    field_selector: str = ""
    server_timeout_s: int = 300  # the server ends each watch after this (jittered); we resume from the last RV
    inactivity_timeout_s: float = 90.0  # longer than the server's bookmark period, so a live idle stream survives
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 10.0
    absent_retry_s: float = 30.0  # how often to look again for a resource type the server does not know
    list_timeout_s: float = 30.0
    log_every_s: float = 30.0  # a repeating fault (list failing, 410 after every list) is logged once per this


@dataclass(frozen=True, slots=True)
class Listed:
    """The complete current set of objects (first list, and every re-list after 410 Gone or an error).

    `served` is False when the server does not know the resource type at all (404 on the list: its CRD is not
    installed); the objects are then empty.
    """

    objects: tuple[Obj, ...]
    resource_version: str
    served: bool = True


@dataclass(frozen=True, slots=True)
class Changed:
    type: EventType
    object: Obj


WatchItem = Listed | Changed


def object_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class ObjectCache:
    """The objects a watch has shown, keyed by (namespace, name). Not thread-safe: fed on the event loop."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], Obj] = {}
        self.listed = False
        self.served = False  # the last list found the resource type (its CRD installed)

    def apply(self, item: WatchItem) -> None:
        if isinstance(item, Listed):
            self.objects = {object_key(o): o for o in item.objects}
            self.listed = True
            self.served = item.served
        elif item.type == "DELETED":
            self.objects.pop(object_key(item.object), None)
        else:
            self.objects[object_key(item.object)] = item.object


class _Backoff:
    def __init__(self, options: WatchOptions) -> None:
        self._initial = options.backoff_initial_s
        self._max = options.backoff_max_s
        self._next = self._initial

    def reset(self) -> None:
        self._next = self._initial

    def peek(self) -> float:
        return self._next

    async def sleep(self) -> None:
        delay = self._next * random.uniform(0.8, 1.2)
        self._next = min(self._max, self._next * 2)
        await asyncio.sleep(delay)


class _Gone(Exception):
    """The resourceVersion to resume from is compacted away: list again."""


class _StreamError(Exception):
    """An ERROR event other than 410."""


@dataclass(frozen=True, slots=True)
class _Ended:
    """The stream ended: cleanly (server timeout) or in an error (reset, protocol error, inactivity timeout)."""

    error: bool


async def watch_objects(
    rest: KubeRest, ref: ResourceRef, options: WatchOptions | None = None
) -> AsyncIterator[WatchItem]:
    """Yield `Listed` then `Changed` items forever, recovering as the module docstring says; cancel to stop."""
    opts = options or WatchOptions()
    backoff = _Backoff(opts)
    relist = _Backoff(opts)  # between lists that a 410 forced with no progress since the last one
    quiet = RateLimitedLog(log, opts.log_every_s)
    loop = asyncio.get_running_loop()
    gone_streak = 0  # 410s in a row, each right after a list, with no event or bookmark in between
    while True:
        try:
            listed = await _list(rest, ref, opts)
        except ApiError as exc:
            if exc.status == 404:
                log.info("%s: not served (CRD not installed?); looking again in %ss", ref, opts.absent_retry_s)
                yield Listed((), "", served=False)
                await asyncio.sleep(opts.absent_retry_s)
            else:
                quiet.log((ref, "list"), logging.WARNING, "%s: list failed: %s", ref, exc)
                await backoff.sleep()
            continue
        yield listed
        resource_version = listed.resource_version
        progressed = False  # an event or a bookmark arrived since this list
        gone = False
        while True:  # watch from resource_version until a re-list is needed
            try:
                opened_at, got_any = loop.time(), False
                async with aclosing(_watch_once(rest, ref, opts, resource_version)) as stream:
                    async for item in stream:
                        if isinstance(item, _Ended):
                            # A server that drops every stream, or ends each one at once with nothing in it,
                            # must not spin us: back off then too.
                            if item.error or (not got_any and loop.time() - opened_at < _INSTANT_END_S):
                                await backoff.sleep()
                            break
                        got_any = progressed = True
                        if isinstance(item, str):
                            resource_version = item  # a bookmark
                            continue
                        meta = item.object.get("metadata") or {}
                        resource_version = str(meta.get("resourceVersion") or resource_version)
                        backoff.reset()
                        yield item
            except _Gone:
                gone = True
                break
            except _StreamError as exc:
                quiet.log((ref, "error-event"), logging.WARNING, "%s: watch error event: %s; listing again", ref, exc)
                await backoff.sleep()
                break
            except ApiError as exc:
                if exc.status == 410:
                    gone = True
                    break
                quiet.log((ref, "watch"), logging.WARNING, "%s: watch failed: %s", ref, exc)
                await backoff.sleep()
                if exc.status in (401, 403, 404):
                    break  # credentials or the CRD changed: start over from a list
                continue
            # the stream ended: resume from resource_version (the loop continues)
        if not gone:
            continue
        if progressed:  # an ordinary compaction after a working watch: list again at once
            gone_streak = 0
            relist.reset()
        gone_streak += 1
        if gone_streak == 1:
            log.info("%s: resourceVersion %s expired (410); listing again", ref, resource_version)
        else:
            # 410 right after every list: the server's history or its cache is broken. Each re-list is a full
            # LIST on the API server, so they back off (exponential, jittered, capped) and the log says it once.
            delay = relist.peek()
            quiet.log(
                (ref, "gone"),
                logging.WARNING,
                "%s: watch answered 410 Gone right after a fresh list (%d times in a row); listing again in ~%.1fs",
                ref,
                gone_streak,
                delay,
            )
            await relist.sleep()


async def _list(rest: KubeRest, ref: ResourceRef, opts: WatchOptions) -> Listed:
    query: dict[str, str | int | bool] = {}
    if opts.label_selector:
        query["labelSelector"] = opts.label_selector
    if opts.field_selector:
        query["fieldSelector"] = opts.field_selector
    body = await asyncio.to_thread(rest.call, "GET", ref.collection_path(), query, None, opts.list_timeout_s)
    items = body.get("items") or []
    kind = str(body.get("kind") or "").removesuffix("List")
    objects = []
    for item in items:
        if isinstance(item, dict):
            # list items carry no apiVersion/kind; add them so consumers see the same shape as watch events
            item.setdefault("apiVersion", ref.api_version)
            if kind:
                item.setdefault("kind", kind)
            objects.append(item)
    return Listed(tuple(objects), str((body.get("metadata") or {}).get("resourceVersion") or ""))


async def _watch_once(
    rest: KubeRest, ref: ResourceRef, opts: WatchOptions, resource_version: str
) -> AsyncGenerator[Changed | str | _Ended, None]:
    """One watch request: Changed items, a str (the resourceVersion of a bookmark), and finally `_Ended`."""
    query: dict[str, str | int | bool] = {
        "watch": True,
        "allowWatchBookmarks": True,
        "timeoutSeconds": max(1, int(opts.server_timeout_s * random.uniform(1.0, 1.2))),
    }
    if resource_version:
        query["resourceVersion"] = resource_version
    if opts.label_selector:
        query["labelSelector"] = opts.label_selector
    if opts.field_selector:
        query["fieldSelector"] = opts.field_selector
    loop = asyncio.get_running_loop()
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"watch-{ref.plural}")
    try:
        response = await loop.run_in_executor(
            reader, rest.open, "GET", ref.collection_path(), query, None, opts.inactivity_timeout_s
        )
    except BaseException:
        reader.shutdown(wait=False)
        raise
    lines = iter_lines(response)
    closing = threading.Event()  # set when we end the stream ourselves: the reading thread's error is ours
    try:
        while True:
            line = await loop.run_in_executor(reader, _next_line, lines, closing)
            if isinstance(line, _Ended):
                yield line
                return
            event = _decode(line)
            if event is None:
                log.warning("%s: undecodable watch line skipped: %r", ref, line[:200])
                continue
            kind, obj = event
            if kind == "BOOKMARK":
                yield str(obj.get("metadata", {}).get("resourceVersion") or resource_version)
            elif kind == "ERROR":
                if obj.get("code") == 410:
                    raise _Gone()
                raise _StreamError(f"{obj.get('code')} {obj.get('reason')}: {obj.get('message')}")
            elif kind in ("ADDED", "MODIFIED", "DELETED"):
                yield Changed(kind, obj)  # type: ignore[arg-type]
    finally:
        # Unblocks a worker thread still reading (when we are cancelled) and returns the socket.
        closing.set()
        try:
            response.shutdown()
        except Exception:  # already closed
            pass
        response.release_conn()
        reader.shutdown(wait=False)


def _next_line(lines: Iterator[bytes], closing: threading.Event) -> bytes | _Ended:
    """Next line, or `_Ended` when the stream ended in any way (EOF, reset, protocol error, read timeout). An end
    we caused (`closing`: the watch stopped and shut the socket under this thread's read) is not logged: nothing
    went wrong, and the log may be gone by then."""
    try:
        return next(lines)
    except StopIteration:
        return _Ended(error=False)
    except Exception as exc:  # urllib3 ReadTimeoutError / ProtocolError / socket errors
        if not closing.is_set():
            log.info("watch stream ended: %s", type(exc).__name__)
        return _Ended(error=True)


def _decode(line: bytes) -> tuple[str, Obj] | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        return None
    return str(event.get("type")), event["object"]
