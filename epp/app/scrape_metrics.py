"""Metrics of the scrape side, computed when Prometheus scrapes: refused values, the child's health, data age.

They answer the on-call questions a stale pool raises: is the scrape process up, how often did it restart, how old
is the freshest data the picker decides on, which endpoints are unusable and why, and which endpoints publish
values the picker refuses.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from epp.datastore import EndpointTable
from epp.scrape.process import ScrapeProcess
from epp.scrape.scraper import FAILURE_REASONS, ScrapeService


class ScrapeCollector(Collector):
    def __init__(
        self, table: EndpointTable, scraper: ScrapeService | ScrapeProcess, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._table = table
        self._scraper = scraper
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        scraper = self._scraper
        if isinstance(scraper, ScrapeProcess):
            rejected = scraper.rejected_values()
            up = GaugeMetricFamily(
                "epp_scrape_process_up", "1 while the scrape child process runs, 0 between a death and its restart."
            )
            up.add_metric([], 1.0 if scraper.up else 0.0)
            yield up
            restarts = CounterMetricFamily(
                "epp_scrape_process_restarts", "Scrape child processes restarted after one died or hung."
            )
            restarts.add_metric([], scraper.restarts)
            yield restarts
        else:
            rejected = dict(scraper.rejected_values)
        refused = CounterMetricFamily(
            "epp_scrape_rejected_values",
            "Scraped values refused as implausible (negative, NaN, infinite, out of range), by signal and reason.",
            labels=["signal", "reason"],
        )
        for (signal, reason), count in sorted(rejected.items()):
            refused.add_metric([signal, reason], count)
        yield refused
        snap = self._table.snapshot()
        at = snap.scraped_at[snap.present]
        at = at[~np.isnan(at)]
        age = GaugeMetricFamily(
            "epp_scrape_data_age_seconds",
            "Age of the freshest endpoint metrics the picker holds (grows when scraping stopped; NaN: none yet).",
        )
        age.add_metric([], float(self._clock() - at.max()) if at.size else math.nan)
        yield age
        unusable = GaugeMetricFamily(
            "epp_scrape_unusable_endpoints", "Endpoints whose metrics cannot be used now, by reason.", labels=["reason"]
        )
        counts = dict.fromkeys(FAILURE_REASONS, 0)
        for status in scraper.status().values():
            if status.unusable is not None:
                counts[status.unusable] = counts.get(status.unusable, 0) + 1
        for reason, count in counts.items():
            unusable.add_metric([reason], float(count))
        yield unusable
