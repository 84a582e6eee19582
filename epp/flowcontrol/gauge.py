"""The saturation the dispatch rule reads: the pool as it will be, and what to do when nothing is fresh.

Upstream dispatches every 1 ms against metrics scraped every 50 ms, so between two scrapes it sees the same queue
and keeps dispatching: a burst overshoots into the model servers' own queues. Our detector
(`epp.scheduling.saturation.SaturationDetector`) counts each endpoint's queue as last scraped *plus our own picks
since that scrape*, so every dispatch raises the saturation the next cycle reads. `count_own_picks=False` on the
detector gives upstream's behaviour (scraped metrics only), for the benchmark.

Upstream also counts a stale endpoint as full, so a pool whose metrics are all stale stops dispatching until a
scrape succeeds. `PoolGauge` instead learns, from the last fresh reading, how many of our requests in flight the
pool holds at saturation 1.0 (in flight / saturation), and while every endpoint is stale reads saturation as our
in-flight count over that limit: the pool keeps serving at the concurrency it last sustained.

Any detector works here: `utilization-detector` or `concurrency-detector` (`epp.scheduling.saturation`), or
`self-calibrating-detector` (`epp.scheduling.knee`), which weighs stale data itself (`weighs_staleness`): the
gauge then passes its reading on as it is.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from epp.datastore import Freshness, Snapshot, usable
from epp.datastore.table import IntArray

_MIN_LEARNING_SATURATION = 0.1  # below this, in flight / saturation is too noisy to learn a limit from


class Detector(Protocol):
    def saturation(self, snapshot: Snapshot, candidates: IntArray, now: float) -> float: ...


class PoolGauge:
    """Wraps a detector with the all-stale fallback; `fallback=False` is upstream's freeze."""

    def __init__(self, detector: Detector, freshness: Freshness | None = None, fallback: bool = True) -> None:
        self.detector = detector
        self.freshness = freshness or Freshness()
        self.fallback = fallback
        self.learned_limit: float | None = None  # our in-flight requests the pool held at saturation 1.0
        self.last_stale = False

    def saturation(self, snapshot: Snapshot, candidates: IntArray, now: float) -> float:
        if candidates.size == 0:
            return 1.0
        value = self.detector.saturation(snapshot, candidates, now)
        if getattr(self.detector, "weighs_staleness", False):
            self.last_stale = False
            return value
        fresh = usable(snapshot.scraped_at[candidates], snapshot.scrape_failures[candidates], now, self.freshness)
        inflight = float(snapshot.inflight[candidates].sum())
        self.last_stale = not bool(np.any(fresh))
        if not self.last_stale:
            if bool(np.all(fresh)) and value >= _MIN_LEARNING_SATURATION and inflight > 0:
                self.learned_limit = inflight / value
            return value
        if not self.fallback or self.learned_limit is None:
            return value  # upstream: every endpoint counts full
        return inflight / self.learned_limit
