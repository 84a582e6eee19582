"""Several InferencePools followed by one Kubernetes source (`--pool-name a --pool-name b`, or `--pool-selector`).

The pools of the picker's namespace are watched with one list+watch (the API server filters by `--pool-selector`
when given; repeated names are filtered here), so the RBAC is the single pool's: list and watch of inferencepools
in the namespace. Each pool found keeps its own spec (selector, targetPorts, failureMode) and its own
`ObjectiveStore` (the objectives and rewrites whose `poolRef` names it); a pod's endpoints carry the key of the
pool that selects them (`EndpointInfo.pool`). A pool added to the namespace (or labelled to match the selector) is
served at once; one deleted leaves with its endpoints. An address two pools select stays with the first by key
(logged once): one address is one row of the table.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from epp.datastore.objectives import ObjectiveStore, RewriteRule
from epp.datastore.pool import FailureMode, PoolSpec, parse_pool
from epp.datastore.pools import pool_key
from epp.datastore.table import EndpointInfo
from epp.discovery.kubernetes.endpoints import PodView, endpoints_of
from epp.discovery.kubernetes.objectives import objective_priorities, pool_rewrites
from epp.discovery.kubernetes.watch import ObjectCache, WatchItem
from epp.errors import ConfigError

log = logging.getLogger(__name__)


class PoolFollower:
    """The pools one source serves, from the pools watch; pure bookkeeping, fed on the event loop."""

    def __init__(self, names: Iterable[str], group: str) -> None:
        self._names = frozenset(names)  # empty: every pool the watch shows (the selector's)
        self._group = group
        self._cache = ObjectCache()
        self.specs: dict[str, PoolSpec] = {}  # key (namespace/name) → spec, sorted by key
        self._stores: dict[str, ObjectiveStore] = {}
        self._rewrites: dict[str, dict[str, tuple[RewriteRule, ...]]] = {}
        self._overlaps: set[str] = set()

    @property
    def listed(self) -> bool:
        return self._cache.listed

    def objectives_of(self, key: str) -> ObjectiveStore:
        """The pool's objectives and rewrites (made on first ask, so a pool's director can hold it before the pool
        is seen)."""
        store = self._stores.get(key)
        if store is None:
            store = self._stores[key] = ObjectiveStore()
        return store

    def apply(self, item: WatchItem) -> tuple[bool, bool]:
        """Fold one watch item in; (whether any pool's spec changed, whether endpoints must be recomputed)."""
        self._cache.apply(item)
        specs: dict[str, PoolSpec] = {}
        for (namespace, name), obj in sorted(self._cache.objects.items()):
            if self._names and name not in self._names:
                continue
            key = pool_key(namespace or "default", name)
            try:
                specs[key] = parse_pool(obj, source=f"InferencePool {key}")
            except ConfigError as exc:
                previous = self.specs.get(key)
                log.error("%s; %s", exc, "keeping the previous spec" if previous is not None else "not served")
                if previous is not None:
                    specs[key] = previous
        old = self.specs
        if specs == old:
            return False, False
        rebuild = specs.keys() != old.keys() or any(
            (s.selector, s.target_ports) != (old[k].selector, old[k].target_ports) for k, s in specs.items()
        )
        for key in specs.keys() - old.keys():
            log.info("InferencePool %s served: %s", key, specs[key])
        for key in old.keys() - specs.keys():
            log.warning("InferencePool %s is gone: its endpoints leave", key)
        self.specs = specs
        return True, rebuild

    def endpoints_of(self, view: PodView) -> tuple[EndpointInfo, ...]:
        """The pod's endpoints in every pool that selects it, each with its pool's key."""
        out: list[EndpointInfo] = []
        seen: set[str] = set()
        for key, spec in self.specs.items():
            for info in endpoints_of(view, spec):
                if info.address in seen:
                    if info.address not in self._overlaps:
                        self._overlaps.add(info.address)
                        log.warning("%s is selected by several pools; it stays in the first, %s", info.address,
                                    next(i.pool for i in out if i.address == info.address))  # fmt: skip
                    continue
                seen.add(info.address)
                out.append(dataclasses.replace(info, pool=key))
        return tuple(out)

    def any_fail_close(self) -> bool:
        return any(spec.failure_mode is FailureMode.FAIL_CLOSE for spec in self.specs.values())

    def publish(self, objectives: list[dict[str, Any]], rewrites: list[dict[str, Any]]) -> None:
        """Each pool's objectives and rewrites: the objects whose poolRef names it."""
        for key, spec in self.specs.items():
            store = self.objectives_of(key)
            priorities = objective_priorities(objectives, spec.name, self._group)
            if priorities != store.objectives():
                store.replace_objectives(priorities)
            rules = pool_rewrites(rewrites, spec.name, self._group)
            if rules != self._rewrites.get(key):
                store.replace_rewrites(rules)
                self._rewrites[key] = rules

    def status(self) -> Mapping[str, Any]:
        return {
            key: {
                "selector": dict(spec.selector),
                "targetPorts": list(spec.target_ports),
                "failureMode": spec.failure_mode.value,
            }
            for key, spec in self.specs.items()
        }
