"""The picker's endpoint source in a cluster: InferencePool + Pods (+ objectives, rewrites, leader election).

    source = KubernetesSource(table, objectives, settings)   # settings: settings_from_flags(args)
    await source.start()          # returns at once; watches run as tasks
    source.pool_spec()            # the current PoolSpec (None before the pool is seen or after it is deleted)
    source.ready                  # synced, pool present, and (with --ha-enable-leader-election) the leader
    source.subscribe(callback)    # called (no arguments) whenever `ready` or the pool spec changes
    await source.stop()           # cancels the watches, releases the Lease

Pods are watched namespace-wide and filtered here, so a change of the pool's selector or target ports applies
at once from the cache, without restarting a watch. Pod events update the table incrementally (a pod's endpoints
keep their slots, hence their metrics, while the pod stays); a pool change or a re-list reconciles the whole
table with `replace_all`, which removes whatever disappeared while the watch was away.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from epp.datastore.objectives import ObjectiveStore, RewriteRule
from epp.datastore.pool import POOL_VERSION, FailureMode, PoolSpec, parse_pool
from epp.datastore.table import EndpointInfo, EndpointTable
from epp.discovery.kubernetes.endpoints import PodView, endpoints_of, pod_view
from epp.discovery.kubernetes.lease import LeaderElector
from epp.discovery.kubernetes.objectives import (
    OBJECTIVE_GROUPS,
    OBJECTIVE_VERSION,
    OBJECTIVES_PLURAL,
    REWRITES_PLURAL,
    group_in_force,
    objective_priorities,
    pool_rewrites,
)
from epp.discovery.kubernetes.pools import PoolFollower
from epp.discovery.kubernetes.rest import KubeRest, ResourceRef, load_api_client
from epp.discovery.kubernetes.settings import KubernetesSettings
from epp.discovery.kubernetes.watch import Listed, ObjectCache, WatchItem, WatchOptions, watch_objects
from epp.errors import ConfigError

log = logging.getLogger(__name__)


class KubernetesSource:
    """See the module docstring. All state changes happen on the event loop that called `start()`."""

    def __init__(
        self,
        table: EndpointTable,
        objectives: ObjectiveStore | None,
        settings: KubernetesSettings,
        rest: KubeRest | None = None,
    ) -> None:
        self.table = table
        self.objectives = objectives
        self.settings = settings
        self._rest = rest
        self._owns_client = rest is None
        self._api_client: Any = None
        self._pool: PoolSpec | None = settings.standalone_pool() if settings.standalone else None
        self._pool_listed = settings.standalone
        # Several pools (--pool-name repeated, --pool-selector): each with its spec and objectives, keyed on the
        # endpoints (epp.discovery.kubernetes.pools); None: the one pool (or standalone selector) of `_pool`.
        self.pools = PoolFollower(settings.pool_names, settings.pool_group) if settings.multi else None
        self._pods_listed = False
        self._pods: dict[str, PodView] = {}
        self._contrib: dict[str, tuple[EndpointInfo, ...]] = {}  # pod name → the endpoints it gives now
        self._owners: dict[str, set[str]] = {}  # address → pods giving it (two pods may share a hostNetwork IP)
        self._objective_caches: dict[tuple[str, str], ObjectCache] = {}
        self._published_rewrites: dict[str, tuple[RewriteRule, ...]] | None = None
        # plural → (the group whose objects count, the served groups ignored): logged when it changes
        self._groups_in_force: dict[str, tuple[str | None, tuple[str, ...]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._listeners: list[Callable[[], None]] = []
        self._elector: LeaderElector | None = None
        self._last_ready = False

    # -- public ----------------------------------------------------------------------------------------------

    def pool_spec(self) -> PoolSpec | None:
        return self._pool

    @property
    def pool(self) -> PoolSpec | None:
        return self._pool

    @property
    def leader(self) -> bool:
        """Whether this replica serves as the leader now.

        The Lease's holder by client-go's rules, and also, for a FailClose pool, a leader that stepped down only
        because the API server stopped answering while no other holder is known (`LeaderElector.holding`): the
        endpoint set it holds is still the last one the API server gave, and not-ready would turn an API-server
        blip into 503s for every request. Once the Lease is seen held by another candidate it is a follower.
        A FailOpen pool steps down as client-go does: the gateway then balances over the pool by itself.
        """
        elector = self._elector
        if elector is None or elector.is_leader:
            return True
        if self.pools is not None:
            return elector.holding and self.pools.any_fail_close()
        pool = self._pool
        return elector.holding and pool is not None and pool.failure_mode is FailureMode.FAIL_CLOSE

    @property
    def ready(self) -> bool:
        has_pool = self._pool is not None if self.pools is None else self.pools.listed
        return self.table.synced and has_pool and self.leader

    def subscribe(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def status(self) -> dict[str, Any]:
        """A summary for /debug pages and logs."""
        pool = self._pool
        return {
            "mode": "standalone" if self.settings.standalone else "pool",
            "namespace": self.settings.namespace,
            "pool": pool.name if pool is not None else None,
            "selector": dict(pool.selector) if pool is not None else None,
            "selectorExpressions": [str(r) for r in pool.expressions] if pool is not None else None,
            "target_ports": list(pool.target_ports) if pool is not None else None,
            "failure_mode": pool.failure_mode.value if pool is not None else None,
            "synced": self.table.synced,
            "leader_election": self._elector is not None,
            "leader": self.leader,
            "lease": None if self._elector is None else self._lease_status(),
            "ready": self.ready,
            "pods_seen": len(self._pods),
            "endpoints": len(self.table),
        } | ({"pools": self.pools.status(), "mode": "pools"} if self.pools is not None else {})

    def _lease_status(self) -> dict[str, Any]:
        elector = self._elector
        assert elector is not None
        return {
            "state": elector.state(),
            "unreachableSince": elector.unreachable_since,
            "lastError": elector.last_error,
        }

    def connect(self) -> None:
        """Load the client configuration (kubeconfig or in-cluster); ConfigError when there is none usable.

        Blocking (reads a few files): call it at start-up, before serving, so a bad `--kubeconfig` ends the
        process with one clear line instead of a half-started picker. `start()` calls it if nobody did.
        """
        if self._rest is not None:
            return
        try:
            self._api_client = load_api_client(self.settings.kubeconfig)
        except Exception as exc:  # ConfigException, OSError, YAML errors: all mean "cannot talk to the cluster"
            where = f"--kubeconfig {self.settings.kubeconfig}" if self.settings.kubeconfig else "in-cluster config"
            raise ConfigError(f"{where}: {' '.join(str(exc).split())}") from None  # one line for the pod log
        self._rest = KubeRest(self._api_client)

    async def start(self) -> None:
        if self._rest is None:
            await asyncio.to_thread(self.connect)
        rest = self._rest
        assert rest is not None
        s = self.settings
        options = s.watch
        self._spawn("pods", self._follow(rest, ResourceRef("", "v1", "pods", s.namespace), options, self._on_pods))
        if not s.standalone:
            pools = ResourceRef("inference.networking.k8s.io", POOL_VERSION, "inferencepools", s.namespace)
            if self.pools is not None:  # several pools: one watch of the namespace's (filtered by the selector)
                matching = dataclasses.replace(options, label_selector=s.pool_selector)
                self._spawn("pools", self._follow(rest, pools, matching, self._on_pools))
            else:
                by_name = dataclasses.replace(options, field_selector=f"metadata.name={s.pool_name}")
                self._spawn("pool", self._follow(rest, pools, by_name, self._on_pool))
            if self.objectives is not None:
                for group in OBJECTIVE_GROUPS:
                    for plural in (OBJECTIVES_PLURAL, REWRITES_PLURAL):
                        ref = ResourceRef(group, OBJECTIVE_VERSION, plural, s.namespace)
                        cache = self._objective_caches.setdefault((group, plural), ObjectCache())
                        self._spawn(f"{plural}.{group}", self._follow(rest, ref, options, self._objectives(cache)))
        if s.leader_election:
            self._elector = LeaderElector(
                rest,
                s.namespace,
                s.effective_lease_name(),
                s.effective_identity(),
                s.lease,
                on_change=lambda _leader: self._notify(),
            )
            self._spawn("lease", self._elector.run())

    async def stop(self) -> None:
        self._listeners.clear()  # the owner is shutting down: no readiness flips from here on
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._elector is not None:
            await self._elector.release()
        if self._owns_client and self._api_client is not None:
            await asyncio.to_thread(self._api_client.close)
            self._api_client = None

    async def wait_ready(self, timeout_s: float) -> bool:
        """True once `ready` (bounded wait, for tests and start-up logs)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.ready and loop.time() < deadline:
            await asyncio.sleep(0.02)
        return self.ready

    # -- plumbing --------------------------------------------------------------------------------------------

    def _spawn(self, name: str, coro: Awaitable[None]) -> None:
        self._tasks.append(asyncio.ensure_future(coro))
        self._tasks[-1].set_name(f"k8s-{name}")

    async def _follow(
        self, rest: KubeRest, ref: ResourceRef, options: WatchOptions, handle: Callable[[WatchItem], None]
    ) -> None:
        """Feed one watch into its handler; a bug in a handler is logged and the watch restarted, never silent."""
        while True:
            try:
                async for item in watch_objects(rest, ref, options):
                    handle(item)
                    self._notify_if_ready_changed()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: watch handler failed; restarting the watch", ref)
                await asyncio.sleep(1.0)

    def _notify_if_ready_changed(self) -> None:
        if self.ready != self._last_ready:
            self._notify()

    def _notify(self) -> None:
        self._last_ready = self.ready
        for callback in self._listeners:
            try:
                callback()
            except Exception:
                log.exception("readiness listener failed")

    def _mark_synced(self) -> None:
        if not self.table.synced and self._pool_listed and self._pods_listed:
            self.table.synced = True
            log.info("kubernetes source synced: %d endpoints", len(self.table))

    # -- the pool ----------------------------------------------------------------------------------------------

    def _on_pool(self, item: WatchItem) -> None:
        if isinstance(item, Listed):
            obj = next((o for o in item.objects if o.get("metadata", {}).get("name") == self.settings.pool_name), None)
            self._pool_listed = True
        elif item.object.get("metadata", {}).get("name") != self.settings.pool_name:
            return
        else:
            obj = None if item.type == "DELETED" else item.object
        if obj is None:
            if self._pool is not None:
                log.warning(
                    "InferencePool %s/%s is gone: no endpoints", self.settings.namespace, self.settings.pool_name
                )
            self._set_pool(None)
        else:
            try:
                spec = parse_pool(obj, source=f"InferencePool {self.settings.namespace}/{self.settings.pool_name}")
            except ConfigError as exc:
                log.error("%s; keeping the previous spec", exc)
            else:
                self._set_pool(spec)
        self._mark_synced()

    def _set_pool(self, spec: PoolSpec | None) -> None:
        old = self._pool
        if spec == old:
            return
        self._pool = spec
        if old is None or spec is None or old.selector != spec.selector or old.target_ports != spec.target_ports:
            self._rebuild()
        log.info("pool spec now %s", spec)
        self._notify()

    def _on_pools(self, item: WatchItem) -> None:
        assert self.pools is not None
        changed, rebuild = self.pools.apply(item)
        self._pool_listed = True
        if rebuild:
            self._rebuild()
        self._mark_synced()
        if changed:
            self._publish_objectives()  # a new pool's objectives are already in the caches
            self._notify()

    def _endpoints_of(self, view: PodView) -> tuple[EndpointInfo, ...]:
        return endpoints_of(view, self._pool) if self.pools is None else self.pools.endpoints_of(view)

    # -- pods --------------------------------------------------------------------------------------------------

    def _on_pods(self, item: WatchItem) -> None:
        if isinstance(item, Listed):
            self._pods = {v.name: v for v in map(pod_view, item.objects) if v.name}
            self._pods_listed = True
            self._rebuild()
            self._mark_synced()
            return
        view = pod_view(item.object)
        if not view.name:
            return
        self._apply_pod(view.name, None if item.type == "DELETED" else view)

    def _apply_pod(self, name: str, view: PodView | None) -> None:
        if view is None:
            self._pods.pop(name, None)
        else:
            self._pods[name] = view
        old = self._contrib.pop(name, ())
        new = self._endpoints_of(view) if view is not None else ()
        if new:
            self._contrib[name] = new
        kept = {info.address for info in new}
        for info in old:
            if info.address in kept:
                continue
            owners = self._owners.get(info.address)
            if owners is not None:
                owners.discard(name)
                if not owners:
                    del self._owners[info.address]
                    self.table.remove(info.address)
        for info in new:
            self._owners.setdefault(info.address, set()).add(name)
            self.table.upsert(info)

    def _rebuild(self) -> None:
        """Recompute every pod's endpoints and make the table hold exactly those."""
        self._contrib = {}
        self._owners = {}
        for name, view in self._pods.items():
            infos = self._endpoints_of(view)
            if infos:
                self._contrib[name] = infos
                for info in infos:
                    self._owners.setdefault(info.address, set()).add(name)
        ordered = [info for name in sorted(self._contrib) for info in self._contrib[name]]
        added, removed = self.table.replace_all(ordered)
        if added or removed:
            log.info("endpoints reconciled: %d added, %d removed, %d now", added, removed, len(self.table))

    # -- objectives and rewrites ------------------------------------------------------------------------------

    def _objectives(self, cache: ObjectCache) -> Callable[[WatchItem], None]:
        def handle(item: WatchItem) -> None:
            cache.apply(item)
            self._publish_objectives()

        return handle

    def _in_force(self, plural: str) -> list[dict[str, Any]]:
        """The objects of one kind from the group in force (`group_in_force`); a change of group is logged once."""
        served = {g: c.served if c.listed else None for (g, p), c in self._objective_caches.items() if p == plural}
        group = group_in_force(served)
        ignored = tuple(g for g in OBJECTIVE_GROUPS if g != group and served.get(g))
        if self._groups_in_force.get(plural) != (group, ignored):
            self._groups_in_force[plural] = (group, ignored)
            if ignored:
                log.warning(
                    "%s: served in %s too; using %s and ignoring those objects, as upstream",
                    plural,
                    ", ".join(ignored),
                    group,
                )
            elif group is not None:
                log.info("%s: using the API group %s", plural, group)
        cache = self._objective_caches.get((group, plural)) if group is not None else None
        return list(cache.objects.values()) if cache is not None else []

    def _publish_objectives(self) -> None:
        store = self.objectives
        if store is None:
            return
        if self.pools is not None:
            self.pools.publish(self._in_force(OBJECTIVES_PLURAL), self._in_force(REWRITES_PLURAL))
            return
        name, group = self.settings.pool_name, self.settings.pool_group
        priorities = objective_priorities(self._in_force(OBJECTIVES_PLURAL), name, group)
        if priorities != store.objectives():
            store.replace_objectives(priorities)
        rules = pool_rewrites(self._in_force(REWRITES_PLURAL), name, group)
        if rules != self._published_rewrites:
            store.replace_rewrites(rules)
            self._published_rewrites = rules
