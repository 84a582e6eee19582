"""Metrics of the KV-events feeder and the precise producer (`llm_d_epp_kv_cache_events_*`), read at scrape time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from epp.app.kv_feeder import KvFeederProcess
from epp.scheduling.precise import NEVER, PrecisePrefixCacheProducer

PREFIX = "llm_d_epp_kv_cache_events"


class KvEventsCollector(Collector):
    def __init__(self, feeder: KvFeederProcess, clock: Callable[[], float] = time.monotonic) -> None:
        self._feeder = feeder
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        feeder = self._feeder
        now = self._clock()
        up = GaugeMetricFamily(f"{PREFIX}_feeder_up", "1 while the KV-events feeder process runs.")
        up.add_metric([], 1.0 if feeder.up else 0.0)
        yield up
        restarts = CounterMetricFamily(f"{PREFIX}_feeder_restarts", "KV-events feeder processes restarted.")
        restarts.add_metric([], feeder.restarts)
        yield restarts
        batches = CounterMetricFamily(
            f"{PREFIX}_batches", "KV event batches applied, per endpoint.", labels=["endpoint"]
        )
        problems = CounterMetricFamily(
            f"{PREFIX}_stream_problems",
            "Per endpoint: malformed payloads, sequence gaps, engine restarts, entries dropped.",
            labels=["endpoint", "problem"],
        )
        age = GaugeMetricFamily(
            f"{PREFIX}_last_event_age_seconds", "Seconds since the endpoint's last event batch.", labels=["endpoint"]
        )
        for endpoint, stats in sorted(feeder.stats.items()):
            batches.add_metric([endpoint], stats.get("batches", 0))
            for problem in ("malformed", "gaps", "restarts", "drops"):
                problems.add_metric([endpoint, problem], stats.get(problem, 0))
            last = feeder.last_event_at(endpoint)
            if last != NEVER:
                age.add_metric([endpoint], max(0.0, now - last))
        yield batches
        yield problems
        yield age
        blocks = CounterMetricFamily(
            f"{PREFIX}_blocks", "Blocks the engines reported, by event (stored, removed, evicted).", labels=["event"]
        )
        for event in ("stored", "removed", "evicted"):
            blocks.add_metric([event], float(feeder.counters.get(event, 0)))
        yield blocks
        held = GaugeMetricFamily(f"{PREFIX}_indexed_blocks", "Engine blocks in the index now, all endpoints.")
        held.add_metric([], float(feeder.counters.get("blocks", 0)))
        yield held


class PreciseFallbacksCollector(Collector):
    """The precise producer's fallbacks, from the process whose producer picks: the control process alone, or
    each serving worker (summed by the control process)."""

    def __init__(self, producer: PrecisePrefixCacheProducer) -> None:
        self._producer = producer

    def collect(self) -> Iterator[Metric]:
        fallbacks = CounterMetricFamily(
            "llm_d_epp_precise_prefix_fallbacks",
            "Endpoint matches taken from the approximate producer instead of the KV events, by reason "
            "(absent: no events ever; stale: work sent, no event since; no_tokens: no engine token ids).",
            labels=["reason"],
        )
        for reason, count in sorted(self._producer.fallbacks.items()):
            fallbacks.add_metric([reason], count)
        yield fallbacks
