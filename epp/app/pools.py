"""One picker for several InferencePools: the pools it serves, one director per pool, and the router each ext_proc
stream asks for its pool's pipeline (docs/kubernetes.md, "One picker for several pools").

What stays shared: the endpoint table (every pool's endpoints, each keyed with its pool), the scrape child, the
ext_proc port and its TLS, health, `/metrics`, the leader election. What each pool has of its own: its endpoints,
targetPorts and failureMode (its InferencePool), its objectives and rewrites, its scheduler (built from its own
`--pool-config-file`, else from `--config-file`: a prefix index of its own), and its request counts
(`llm_d_epp_pool_requests_total{pool}`). A pool's director is built when its first stream comes, so pools added at
run time (a new InferencePool matching `--pool-selector`) are served without a restart, and a pool that is gone
answers as a pool this picker does not serve.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from epp.datastore.objectives import ObjectiveStore
from epp.datastore.pool import FailureMode, PoolSpec
from epp.datastore.pools import pool_key, split_key
from epp.datastore.table import EndpointInfo, EndpointTable
from epp.director.pools import PoolRoute
from epp.errors import ConfigError
from epp.observability.pools import PoolRequestCollector

log = logging.getLogger("epp")


class PoolSet(Protocol):
    """The pools a picker serves now, by key (`namespace/name`), and each pool's objectives (the Kubernetes
    source's `PoolFollower`, or the pool files' `StaticPools`)."""

    specs: dict[str, PoolSpec]

    def objectives_of(self, key: str) -> ObjectiveStore: ...


class StaticPools:
    """Cluster-free: the pool files, for the picker's life; the endpoints file's entries go to the first pool
    (by key) whose selector matches their labels."""

    def __init__(self, specs: list[PoolSpec]) -> None:
        self.specs: dict[str, PoolSpec] = {}
        for spec in specs:
            key = pool_key(spec.namespace, spec.name)
            if key in self.specs:
                raise ConfigError(f"--pool-file: the InferencePool {key} is given twice")
            self.specs[key] = spec
        self.specs = dict(sorted(self.specs.items()))
        self._stores: dict[str, ObjectiveStore] = {}

    def objectives_of(self, key: str) -> ObjectiveStore:
        store = self._stores.get(key)
        if store is None:
            store = self._stores[key] = ObjectiveStore()
        return store

    def assign(self, endpoints: list[EndpointInfo]) -> list[EndpointInfo]:
        out = []
        for info in endpoints:
            key = next((k for k, spec in self.specs.items() if spec.selects(info.labels)), None)
            if key is not None:
                out.append(dataclasses.replace(info, pool=key))
        return out


def normalise_pool_configs(configs: tuple[tuple[str, str], ...], namespace: str) -> dict[str, str]:
    """`--pool-config-file` values → {pool key: path}; a bare name is in the picker's namespace."""
    out: dict[str, str] = {}
    for pool, path in configs:
        key = pool_key(*split_key(pool, namespace))
        if key in out:
            raise ConfigError(f"--pool-config-file: {key} is given twice")
        out[key] = path
    return out


class PoolDirectors:
    """The route of each pool served now: its director's pipeline (built on first use by `make`) and its
    observer. `route_of` is the `PoolRouter`'s lookup, one dict hit per stream once the pool's director exists."""

    def __init__(self, pools: PoolSet, make: Callable[[str], Any], observers: PoolRequestCollector) -> None:
        self._pools = pools
        self._make = make
        self._observers = observers
        self._routes: dict[str, PoolRoute] = {}

    def route_of(self, key: str) -> PoolRoute | None:
        if key not in self._pools.specs:
            return None
        route = self._routes.get(key)
        if route is None:
            decider = self._make(key)
            route = self._routes[key] = PoolRoute(decider.pipeline, self._observers.observer(key))
            log.info("pool %s: its director is built", key)
        return route

    def failure_mode(self, key: str) -> FailureMode:
        spec = self._pools.specs.get(key)
        return spec.failure_mode if spec is not None else FailureMode.FAIL_CLOSE


def pools_report(pools: PoolSet, table: EndpointTable) -> Mapping[str, Any]:
    """/debug/pool's `pools`: each pool's spec, its endpoints and how many the table holds."""
    members: dict[str, list[str]] = {key: [] for key in pools.specs}
    for address in table.addresses():
        slot = table.slot_of(address)
        info = table.info(slot) if slot is not None else None
        if info is not None and info.pool in members:
            members[info.pool].append(address)
    return {
        key: {
            "name": spec.name,
            "namespace": spec.namespace,
            "failureMode": spec.failure_mode.value,
            "selector": dict(spec.selector),
            "targetPorts": list(spec.target_ports),
            "endpoints": sorted(members[key]),
        }
        for key, spec in pools.specs.items()
    }
