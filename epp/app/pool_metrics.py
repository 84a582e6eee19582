"""Upstream's pool gauges, computed from the endpoint table when Prometheus scrapes, not on every request."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from epp.datastore import EndpointTable


class PoolCollector(Collector):
    """Upstream's pool gauges, computed from the endpoint table at scrape time."""

    def __init__(self, table: EndpointTable, pool_name: Callable[[], str]) -> None:
        self._table = table
        self._pool_name = pool_name

    def collect(self) -> Iterator[GaugeMetricFamily]:
        name = self._pool_name()
        snap = self._table.snapshot()
        present = snap.present
        ready = GaugeMetricFamily("inference_pool_ready_pods", "Endpoints in the pool.", labels=["name"])
        ready.add_metric([name], float(np.count_nonzero(present)))
        yield ready
        for metric, column, help_text in (
            ("inference_pool_average_kv_cache_utilization", snap.kv_usage, "Mean KV-cache usage (0..1)."),
            ("inference_pool_average_queue_size", snap.waiting, "Mean waiting requests per endpoint."),
            ("inference_pool_average_running_requests", snap.running, "Mean running requests per endpoint."),
        ):
            values = column[present]
            known = values[~np.isnan(values)]
            family = GaugeMetricFamily(metric, help_text, labels=["name"])
            family.add_metric([name], float(known.mean()) if known.size else math.nan)
            yield family
