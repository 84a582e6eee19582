"""Pool saturation (upstream's utilization detector) and the per-endpoint filter built on the same thresholds.

Saturation = mean over candidates of max(queue / queueDepthThreshold, kv / kvCacheUtilThreshold) — a roofline:
an endpoint is as full as its most constrained resource. ≥ 1.0 means the pool is saturated, and sheddable requests
(priority < 0) get 429. Two choices differ from upstream, both toward fewer wrong answers:

- the queue is the *effective* queue, last scraped `waiting` plus our picks since that scrape, so a burst that has
  filled the pool is seen before the next scrape;
- a metric the engine does not export (NaN in a fresh scrape) is left out of that endpoint's max; with neither
  signal the endpoint counts 0. Unknown is not evidence of load. Stale endpoints (no scrape within the staleness
  threshold, or never scraped) count 1.0 as upstream: an endpoint we cannot hear from is assumed full.
"""

from __future__ import annotations

import numpy as np

from epp.config.model import SaturationThresholds
from epp.datastore import Snapshot
from epp.datastore.table import BoolArray, FloatArray, IntArray
from epp.scheduling.framework import SMALL_POOL, CycleState

MAX_SCRAPE_FAILURES = 3


def effective_queue(snapshot: Snapshot, candidates: IntArray) -> FloatArray:
    """Last scraped waiting + own picks since that scrape (NaN stays NaN)."""
    return snapshot.waiting[candidates] + snapshot.picks_since_scrape[candidates]


def stale(snapshot: Snapshot, candidates: IntArray, now: float, staleness_s: float) -> BoolArray:
    """Scraped longer ago than the threshold, never scraped (NaN compares False), or failing repeatedly."""
    fresh = snapshot.scraped_at[candidates] >= now - staleness_s
    fresh &= snapshot.scrape_failures[candidates] < MAX_SCRAPE_FAILURES
    return ~fresh


class SaturationDetector:
    """The pool-level signal the director reads before admitting a sheddable request."""

    def __init__(self, thresholds: SaturationThresholds | None = None) -> None:
        self.thresholds = thresholds or SaturationThresholds()

    def saturation(self, snapshot: Snapshot, candidates: IntArray, now: float) -> float:
        """Mean roofline ratio over the candidates; 1.0 when there is none (nothing can take the request)."""
        if candidates.size == 0:
            return 1.0
        t = self.thresholds
        q = effective_queue(snapshot, candidates) / t.queue_depth
        kv = snapshot.kv_usage[candidates] / t.kv_util
        per = np.fmax(q, kv)  # fmax: a NaN side is ignored
        np.nan_to_num(per, copy=False, nan=0.0)
        per[stale(snapshot, candidates, now, t.staleness_s)] = 1.0
        return float(per.mean())

    def saturated(self, snapshot: Snapshot, candidates: IntArray, now: float) -> bool:
        return self.saturation(snapshot, candidates, now) >= 1.0


class SaturationFilter:
    """`utilization-detector` as a filter (alias `saturation-filter`): drops endpoints that are stale or whose
    effective queue or KV usage is at or over threshold × (1 + headroom). If that would drop every candidate it
    keeps them all: a full pool still has to answer, and the scorers then pick the least bad endpoint."""

    type_name = "utilization-detector"

    def __init__(self, name: str = "utilization-detector", thresholds: SaturationThresholds | None = None) -> None:
        self.name = name
        self.thresholds = thresholds or SaturationThresholds()

    def filter(self, state: CycleState, candidates: IntArray) -> IntArray:
        t = self.thresholds
        snapshot = state.snapshot
        take = state.take
        factor = 1.0 + t.headroom
        queue_limit, kv_limit, cutoff = t.queue_depth * factor, t.kv_util * factor, state.now - t.staleness_s
        extreme = state.extreme
        # Common case first, from the pick's shared column extremes: nobody over a threshold, nobody stale. NaN
        # anywhere fails these comparisons and takes the exact path below.
        if (
            extreme("effective_queue", candidates, True) < queue_limit
            and extreme("kv_usage", candidates, True) < kv_limit
            and extreme("scraped_at", candidates, False) >= cutoff
            and extreme("scrape_failures", candidates, True) < MAX_SCRAPE_FAILURES
        ):
            return candidates
        queue = take(state.effective_queue(), candidates)
        kv = take(snapshot.kv_usage, candidates)
        scraped_at = take(snapshot.scraped_at, candidates)
        failures = take(snapshot.scrape_failures, candidates)
        if candidates.size <= SMALL_POOL:  # a few dozen endpoints: one pass over Python lists beats eight numpy calls
            rows = zip(queue.tolist(), kv.tolist(), scraped_at.tolist(), failures.tolist(), strict=True)
            # NaN compares False: an unknown signal is not "over"; never scraped (NaN) is not fresh.
            kept_at = [
                i
                for i, (q, k, at, f) in enumerate(rows)
                if at >= cutoff and f < MAX_SCRAPE_FAILURES and not (q >= queue_limit or k >= kv_limit)
            ]
            if not kept_at or len(kept_at) == candidates.size:
                return candidates
            return candidates[kept_at]
        # NaN compares False: an unknown signal is not "over".
        over: BoolArray = queue >= queue_limit
        over |= kv >= kv_limit
        fresh: BoolArray = scraped_at >= cutoff  # never scraped: NaN → not fresh
        if extreme("scrape_failures", candidates, True) >= MAX_SCRAPE_FAILURES:
            fresh &= failures < MAX_SCRAPE_FAILURES
        keep = np.greater(fresh, over)  # booleans: fresh and not over, in one pass
        kept = np.count_nonzero(keep)
        if kept == 0 or kept == candidates.size:
            return candidates
        return candidates[keep]
