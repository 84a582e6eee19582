"""What the running picker holds, and how readiness follows it: the composition root owns the state, components
get only their part."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from epp.app.health import HealthState
from epp.app.pools import PoolSet
from epp.app.workers import WorkerPool
from epp.datastore import EndpointTable
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.pool import FailureMode, PoolSpec
from epp.discovery.file import FileDiscovery
from epp.discovery.kubernetes.source import KubernetesSource


@dataclass
class PickerState:
    """The endpoint table, the objectives, the pool, readiness and the sources that feed them."""

    table: EndpointTable = field(default_factory=EndpointTable)
    objectives: ObjectiveStore = field(default_factory=ObjectiveStore)
    pool: PoolSpec | None = None
    pools: PoolSet | None = None  # several pools (docs/kubernetes.md): `pool` is then None
    health: HealthState = field(default_factory=HealthState)
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))
    kubernetes: KubernetesSource | None = None
    file_discovery: FileDiscovery | None = None
    workers: WorkerPool | None = None  # --workers N > 1: the serving processes
    stopping: bool = False

    def failure_mode(self) -> FailureMode:
        return self.pool.failure_mode if self.pool is not None else FailureMode.FAIL_CLOSE

    def source_ready(self) -> bool:
        """The endpoint source has delivered its first complete view (readiness also needs leadership, if HA)."""
        if self.kubernetes is not None:
            return self.kubernetes.ready  # synced, pool present, leader (with --ha-enable-leader-election)
        return self.table.synced

    def serving(self) -> bool:
        """Readiness as the picker's state says it should be: the source synced and, with workers, one serving."""
        return self.source_ready() and (self.workers is None or self.workers.serving)

    def ready(self) -> bool:
        """What readiness reports now: off before the source syncs and from the moment the picker is stopping."""
        return self.health.ready

    def pool_name(self) -> str:
        """The pool's name in metrics: the InferencePool's, `standalone` for a selector, `static` without a cluster."""
        if self.pools is not None:
            return "pools"
        if self.kubernetes is not None:
            return self.kubernetes.settings.pool_name or "standalone"
        return self.pool.name if self.pool is not None else "static"

    def namespace(self) -> str:
        return self.pool.namespace if self.pool is not None else ""

    def endpoint_labels(self, address: str) -> tuple[str, str, str]:
        """address → (pod name, namespace, port) for upstream's endpoint labels."""
        slot = self.table.slot_of(address)
        info = self.table.info(slot) if slot is not None else None
        name = info.pod_name if info is not None and info.pod_name else address
        namespace = info.pool.partition("/")[0] if info is not None and info.pool else self.namespace()
        return name, namespace, address.rpartition(":")[2]


_PENDING: set[asyncio.Future[None]] = set()  # strong references until each health update is done


def follow_readiness(state: PickerState) -> None:
    """Something readiness depends on changed (a worker, the pool, leadership): readiness follows, unless the
    picker is already stopping."""
    if state.stopping or state.health.ready == state.serving():
        return
    task = asyncio.ensure_future(state.health.set_ready(state.serving()))
    _PENDING.add(task)
    task.add_done_callback(_PENDING.discard)


async def start_kubernetes(source: KubernetesSource, state: PickerState) -> None:
    """Start the watches; every change of the pool spec or readiness reaches `state` and the health service."""

    def changed() -> None:  # the source stops calling this once its stop() began
        state.pool = source.pool_spec()
        if state.health.ready != state.serving():
            task = asyncio.ensure_future(state.health.set_ready(state.serving()))
            _PENDING.add(task)
            task.add_done_callback(_PENDING.discard)

    source.subscribe(changed)
    await source.start()
