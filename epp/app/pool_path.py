"""The request path of a picker that serves several pools: one director per pool and the router between them
(epp.app.pools holds the pools and the directors; this module builds them with the one builder)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry

from epp.app.build import build_decisions, build_director, build_processor, load_picker_config
from epp.app.federation import FederationParts
from epp.app.pools import PoolDirectors, PoolSet, normalise_pool_configs
from epp.app.receipt_metrics import ReceiptMetrics
from epp.app.settings import ServeSettings
from epp.config.model import EndpointPickerConfig
from epp.datastore import EndpointTable
from epp.director.flow import FlowGate
from epp.director.models import ModelsList
from epp.director.pools import PoolLessMode, PoolRouter
from epp.errors import ConfigError
from epp.extproc.server import ExternalProcessor
from epp.observability.metrics import PickerMetrics
from epp.observability.plugins import PluginTimer
from epp.observability.pools import PoolRequestCollector


def check_pools(flow: FlowGate | None, federation: FederationParts | None, kv_events: bool) -> None:
    """What several pools do not combine with yet: one set of flow-control queues, federation's residency and the
    KV-events feeder are the picker's, not a pool's."""
    if kv_events:
        raise ConfigError("several pools: the precise-prefix-cache-producer (KV events) does not combine with them yet")
    if flow is not None:
        raise ConfigError("several pools: the flowControl feature gate does not combine with them yet")
    if federation is not None:
        raise ConfigError("several pools: federation (--tier, --federation-watch) does not combine with them yet")


def pools_processor(
    settings: ServeSettings,
    config: EndpointPickerConfig | None,
    pools: PoolSet,
    table: EndpointTable,
    registry: CollectorRegistry,
    plugin_timer: PluginTimer,
    tracer: Any,
    metrics: PickerMetrics,
    observer: Any = None,
    receipts: ReceiptMetrics | None = None,
) -> ExternalProcessor:
    """Several pools: a director per pool (its endpoints, failure mode, objectives, and a scheduler of its own,
    from its --pool-config-file or the picker's config), and the router that gives each stream its pool's; the
    control process and every serving worker build the same (`observer`: the server's, a worker's counting one;
    None: `metrics`; `receipts`: the process's route receipts and alarms, each pool's watch attached to it as its
    director is built)."""
    k8s = settings.endpoints.kubernetes
    namespace = k8s.namespace if k8s is not None else "default"
    paths = normalise_pool_configs(settings.endpoints.pool_configs, namespace)
    configs = {key: load_picker_config(replace(settings.config, path=path, text=None)) for key, path in paths.items()}
    for key, pool_config in configs.items():  # each pool's config refused now, before any port, as --config-file is
        if build_decisions(settings, pool_config).scheduler.kv_events is not None:
            raise ConfigError(
                f"--pool-config-file {key}: the precise-prefix-cache-producer does not combine with several pools yet"
            )
    observers = PoolRequestCollector(metrics)
    registry.register(observers)

    def make(key: str) -> Any:
        scheduler = build_decisions(settings, configs[key]).scheduler if key in configs else None
        if scheduler is None:
            scheduler = build_decisions(settings, config).scheduler
        scheduler.instrument(plugin_timer)
        director = build_director(
            settings, scheduler, table, pools.objectives_of(key),
            failure_mode=lambda: directors.failure_mode(key), observer=metrics, pool=key, receipts=receipts,
        )  # fmt: skip
        if tracer is not None:
            from epp.app.tracing import TracingDirector

            return TracingDirector(director, tracer)
        return director

    directors = PoolDirectors(pools, make, observers)
    aggregate = None
    if settings.serve_models_list:  # the union, owned by each pool (by key) that has the name first
        union = ModelsList(table, lambda: [(key, pools.objectives_of(key), True) for key in sorted(pools.specs)])
        aggregate = union.answer
    router = PoolRouter(directors.route_of, namespace, PoolLessMode(settings.endpoints.pool_less_mode), metrics,
                        time.monotonic, aggregate)  # fmt: skip
    return build_processor(settings, config, router.pool_less, observer or metrics, pools=router)
