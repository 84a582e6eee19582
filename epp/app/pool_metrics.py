"""Upstream's pool gauges and the data layer's counters, computed from the endpoint table at scrape time.

`freeze()` runs on the serving loop (a few vector operations over the table); the families are built from that copy,
so `/metrics` can render in a worker thread while the loop keeps deciding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from prometheus_client.core import Metric

from epp.datastore import EndpointTable
from epp.observability import buckets as b
from epp.observability.collector import FreezableCollector
from epp.observability.families import counter_family, gauge_family, histogram_family
from epp.observability.plain import PlainHistogram
from epp.scheduling.scheduler import Scheduler
from epp.scheduling.slo import PredictedLatencyProducer

SOURCE_TYPE = "metrics-data-source"  # upstream's data source type name for the /metrics poller


def _stats(values: np.ndarray[Any, Any]) -> tuple[float, float]:
    known = values[~np.isnan(values)]
    if not known.size:
        return math.nan, math.nan
    return float(known.mean()), float(known.std())


class PoolCollector(FreezableCollector):
    """Averages, standard deviations and ready endpoints (upstream's and the deprecated names), per-endpoint queue
    sizes and in-flight picks, and data-layer poll errors by reason."""

    def __init__(
        self,
        table: EndpointTable,
        pool_name: Callable[[], str],
        poll_errors: Callable[[], dict[str, int]] | None = None,
        pools: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        """`poll_errors`: failed scrapes so far by reason (refused, timeout, http-status, ...), monotonic; `pools`:
        with several pools, their keys now: the pool gauges are then one series per pool (`name` = its key)."""
        self._table = table
        self._pool_name = pool_name
        self._poll_errors = poll_errors or dict
        self._pools = pools

    def snapshot(self) -> dict[str, Any]:
        snap = self._table.snapshot()
        present = snap.present
        per_endpoint = []
        for slot in snap.slots:
            info = snap.infos[slot]
            if info is None:
                continue
            waiting = float(snap.waiting[slot])
            per_endpoint.append((info.address, info.pod_name or info.address, waiting, int(snap.inflight[slot])))
        if self._pools is None:
            names = [self._pool_name()]
            masks = [present]
        else:
            names = sorted(self._pools())
            pool_of = np.array([info.pool if info is not None else "" for info in snap.infos], dtype=object)
            masks = [present & (pool_of == name) for name in names]
        return {
            "pools": [
                (
                    name,
                    float(np.count_nonzero(mask)),
                    _stats(snap.kv_usage[mask]),
                    _stats(snap.waiting[mask]),
                    _stats(snap.running[mask]),
                )
                for name, mask in zip(names, masks, strict=True)
            ],
            "pool_of": {info.address: info.pool for info in snap.infos if info is not None},
            "endpoints": sorted(per_endpoint),
            "poll_errors": dict(self._poll_errors()),
        }

    def families(self, data: Any) -> Iterator[Metric]:
        pools = data["pools"]
        one = ("name",)
        yield gauge_family(
            "llm_d_epp_ready_endpoints", "The number of ready endpoints in the inference server pool.", one,
            [((name,), ready) for name, ready, *_ in pools],
        )  # fmt: skip
        yield gauge_family(
            "inference_pool_ready_pods", "[Deprecated: use llm_d_epp_ready_endpoints] Endpoints in the pool.", one,
            [((name,), ready) for name, ready, *_ in pools],
        )  # fmt: skip
        for index, metric, what in (
            (2, "kv_cache_utilization", "kv cache utilization (0..1)"),
            (3, "queue_size", "number of requests pending in the model server queue"),
            (4, "running_requests", "number of running requests across model servers"),
        ):
            means = [((row[0],), row[index][0]) for row in pools]
            yield gauge_family(f"llm_d_epp_average_{metric}", f"The average {what}.", one, means)
            yield gauge_family(
                f"llm_d_epp_std_dev_{metric}", f"The standard deviation of the {what}.", one,
                [((row[0],), row[index][1]) for row in pools],
            )  # fmt: skip
            yield gauge_family(
                f"inference_pool_average_{metric}", f"[Deprecated: use llm_d_epp_average_{metric}] The average {what}.",
                one, means,
            )  # fmt: skip
        name = pools[0][0] if self._pools is None else None
        pool_of = data["pool_of"]
        yield gauge_family(
            "llm_d_epp_per_endpoint_queue_size",
            "The total number of requests pending in the model server queue for each underlying endpoint.",
            ("name", "model_server_endpoint"),
            [((name or pool_of.get(address, ""), address), waiting) for address, _, waiting, _ in data["endpoints"]],
        )
        yield gauge_family(
            "llm_d_epp_inflight_requests",
            "Current number of in-flight requests per endpoint, as booked by the picker's own picks.",
            ("endpoint_name", "namespace", "producer_name", "fairness_id", "priority"),
            [((pod, "", "inflight-load-producer", "", ""), float(n)) for _, pod, _, n in data["endpoints"]],
        )
        errors = sorted(((SOURCE_TYPE, reason), float(n)) for reason, n in data["poll_errors"].items())
        yield counter_family(
            "llm_d_epp_datalayer_poll_errors",
            "Data-source poll errors per source type, by reason.",
            ("source_type", "reason"),
            errors,
        )
        yield counter_family(
            "llm_d_inference_scheduler_datalayer_poll_errors",
            "[Deprecated: use llm_d_epp_datalayer_poll_errors_total] Data-source poll errors per source type.",
            ("source_type",),
            [((SOURCE_TYPE,), sum(n for _, n in errors))] if errors else [],
        )
        yield counter_family(
            "llm_d_epp_datalayer_extract_errors",
            "Extract errors per source/extractor type (a page that parsed but carried none of the engine's metrics).",
            ("source_type", "extractor_type"),
            [((SOURCE_TYPE, "core-metrics-extractor"), float(data["poll_errors"].get("parse", 0)))],
        )


class PrefixCollector(FreezableCollector):
    """Prefix-index size and hit ratio of each self-contained `prefix-cache-scorer` and `approx-prefix-cache-producer`
    (upstream: the approximate prefix producer)."""

    def __init__(self, plugins: list[Any]) -> None:
        self._plugins = plugins  # objects with name, type_name, index (len), hit_ratio (PlainHistogram)

    @classmethod
    def of(cls, scheduler: Scheduler) -> PrefixCollector:
        """For the scheduler's prefix scorers (those that count their hits). With serving workers each worker
        registers its own, and the control process's /metrics sums them: hit counts add up, and the size is the
        blocks held by all the workers' indexes together (each learns the others' picks through the pick log)."""
        return cls(list(scheduler.prefix_scorers))

    def snapshot(self) -> list[tuple[str, str, float, PlainHistogram, PlainHistogram]]:
        out = []
        for p in self._plugins:
            ratio = PlainHistogram(b.PREFIX_HIT_RATIO)
            ratio.add(p.hit_ratio)
            hit = PlainHistogram(b.PREFIX_HIT_BYTES)
            hit.add(p.hit_bytes)
            out.append((p.name, p.type_name, float(len(p.index)), ratio, hit))
        return out

    def families(self, data: Any) -> Iterator[Metric]:
        labels = ("plugin_name", "plugin_type")
        yield gauge_family(
            "llm_d_epp_prefix_indexer_size", "Size of the prefix indexer (blocks indexed).", labels,
            [((n, t), size) for n, t, size, _, _ in data],
        )  # fmt: skip
        yield histogram_family(
            "llm_d_epp_prefix_indexer_hit_ratio",
            "Ratio of prefix length matched to total prefix length in the cache lookup.", labels,
            [((n, t), ratio) for n, t, _, ratio, _ in data],
        )  # fmt: skip
        yield histogram_family(
            "llm_d_epp_prefix_indexer_hit_bytes", "Length of the prefix match in bytes in the cache lookup.", labels,
            [((n, t), hit) for n, t, _, _, hit in data],
        )  # fmt: skip
        if not data:
            return
        # The deprecated names have no labels: all prefix plugins together.
        ratio, hit = PlainHistogram(b.PREFIX_HIT_RATIO), PlainHistogram(b.PREFIX_HIT_BYTES)
        for _, _, _, r, h in data:
            ratio.add(r)
            hit.add(h)
        deprecated = "[Deprecated: use llm_d_epp_prefix_indexer_*] "
        size = sum(size for _, _, size, _, _ in data)
        yield gauge_family("inference_extension_prefix_indexer_size", deprecated + "Size of the prefix indexer.", (),
                           [((), size)])  # fmt: skip
        yield histogram_family("inference_extension_prefix_indexer_hit_ratio", deprecated + "Prefix hit ratio.", (),
                               [((), ratio)])  # fmt: skip
        yield histogram_family("inference_extension_prefix_indexer_hit_bytes", deprecated + "Prefix hit bytes.", (),
                               [((), hit)])  # fmt: skip


class LatencyCollector(FreezableCollector):
    """The online latency model of each predicted-latency-producer: observations learned, and per endpoint (the
    pool's members: bounded labels) and target its mean absolute prediction error and last prediction."""

    def __init__(self, producers: list[Any]) -> None:
        self._producers = producers  # objects with name and model (epp.scheduling.latency_model.LatencyModel)

    @classmethod
    def of(cls, scheduler: Scheduler) -> LatencyCollector:
        return cls([p for p in scheduler.learners if isinstance(p, PredictedLatencyProducer)])

    def snapshot(self) -> list[tuple[str, dict[str, Any]]]:
        return [(p.name, p.model.report()) for p in self._producers]

    def families(self, data: Any) -> Iterator[Metric]:
        yield counter_family(
            "epp_latency_model_observations",
            "Finished requests the online latency model learned from.",
            ("plugin_name",),
            [((name, ), float(report["observations"])) for name, report in data],
        )  # fmt: skip
        labels = ("plugin_name", "endpoint", "target")
        for metric, key, what in (
            ("epp_latency_prediction_error_seconds", "meanAbsErrorMs", "Mean absolute error of recent predictions"),
            ("epp_latency_predicted_seconds", "lastPredictedMs", "The last prediction made for a finished request"),
        ):
            rows = [
                ((name, address, target), values[key] / 1000.0)
                for name, report in data
                for address, targets in report["endpoints"].items()
                for target, values in targets.items()
                if values[key] is not None
            ]
            yield gauge_family(metric, f"{what} (TTFT or TPOT), per endpoint.", labels, rows)
