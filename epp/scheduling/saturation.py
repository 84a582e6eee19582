"""Pool saturation (upstream's utilization detector) and the per-endpoint filter built on the same thresholds.

Saturation = mean over candidates of max(queue / queueDepthThreshold, kv / kvCacheUtilThreshold) — a roofline:
an endpoint is as full as its most constrained resource. ≥ 1.0 means the pool is saturated, and sheddable requests
(priority < 0) get 429. Two choices differ from upstream, both toward fewer wrong answers:

- the queue is the *effective* queue, last scraped `waiting` plus our picks since that scrape, so a burst that has
  filled the pool is seen before the next scrape;
- a metric the engine does not export (NaN in a fresh scrape) is left out of that endpoint's max; with neither
  signal the endpoint counts 0. Unknown is not evidence of load. Endpoints whose data is not usable
  (`epp.datastore.usable`: older than the pool's staleness threshold, never scraped, or failing
  `--metrics-max-failures` times in a row) count 1.0 as upstream: an endpoint we cannot hear from is assumed full.

The pool has one staleness threshold (`Freshness`): `--metrics-staleness-threshold`, or upstream's
`saturationDetector.metricsStalenessThreshold` when a config file gives one (`epp.scheduling.build`).
"""

from __future__ import annotations

from typing import overload

import numpy as np

from epp.config.model import SaturationThresholds
from epp.datastore import Freshness, Snapshot, usable
from epp.datastore.table import BoolArray, FloatArray, IntArray
from epp.scheduling.framework import CycleState, Signal
from epp.scheduling.totals import NATIVE

SATURATION_FILTER_TYPES = ("utilization-detector", "saturation-filter")  # the filter's type and its alias


@overload
def over(queue: float, kv: float, queue_limit: float, kv_limit: float) -> bool: ...
@overload
def over(queue: FloatArray, kv: FloatArray, queue_limit: float, kv_limit: float) -> BoolArray: ...
def over(queue: object, kv: object, queue_limit: float, kv_limit: float) -> object:
    """At or over either limit; NaN (unknown) compares False: not evidence of load. Elementwise on arrays; on the
    largest known values of a set of endpoints it tells whether any of them is over (the rule is monotone)."""
    return (queue >= queue_limit) | (kv >= kv_limit)  # type: ignore[operator]


def kept_under_numpy(
    candidates: IntArray,
    queue: FloatArray,
    kv: FloatArray,
    fresh: BoolArray | None,
    queue_limit: float,
    kv_limit: float,
) -> IntArray:
    """The definition: the candidates whose data is usable (`fresh`; None: all) and that are not `over` a limit."""
    dropped = over(queue, kv, queue_limit, kv_limit)
    return candidates[~dropped if fresh is None else np.greater(fresh, dropped)]


def kept_under(
    candidates: IntArray,
    queue: FloatArray,
    kv: FloatArray,
    fresh: BoolArray | None,
    queue_limit: float,
    kv_limit: float,
) -> IntArray:
    """`kept_under_numpy`, compiled when it can be (`epp.scheduling.totals`: one call, not five on 8 values)."""
    if NATIVE is not None:
        out: IntArray = np.empty(candidates.size, dtype=np.int64)
        count = NATIVE.kept_under(candidates, queue, kv, fresh, queue_limit, kv_limit, out)
        if count.__class__ is int:
            return out[:count]
    return kept_under_numpy(candidates, queue, kv, fresh, queue_limit, kv_limit)


class SaturationDetector:
    """The pool-level signal the director reads before admitting a sheddable request, and flow control before
    each dispatch. `count_own_picks=False` reads the scraped queue only (upstream's behaviour; the flow-control
    benchmark's baseline)."""

    def __init__(
        self,
        thresholds: SaturationThresholds | None = None,
        freshness: Freshness | None = None,
        count_own_picks: bool = True,
    ) -> None:
        self.thresholds = thresholds or SaturationThresholds()
        self.freshness = freshness or Freshness()
        self.count_own_picks = count_own_picks

    def saturation(self, snapshot: Snapshot, candidates: IntArray, now: float) -> float:
        """Mean roofline ratio over the candidates; 1.0 when there is none (nothing can take the request)."""
        if candidates.size == 0:
            return 1.0
        t = self.thresholds
        queue = snapshot.effective_queue() if self.count_own_picks else snapshot.waiting
        q = queue[candidates] / t.queue_depth
        kv = snapshot.kv_usage[candidates] / t.kv_util
        per = np.fmax(q, kv)  # fmax: a NaN side is ignored
        np.nan_to_num(per, copy=False, nan=0.0)
        fresh = usable(snapshot.scraped_at[candidates], snapshot.scrape_failures[candidates], now, self.freshness)
        per[~fresh] = 1.0
        return float(per.mean())

    def saturated(self, snapshot: Snapshot, candidates: IntArray, now: float) -> bool:
        return self.saturation(snapshot, candidates, now) >= 1.0


class SaturationFilter:
    """`utilization-detector` as a filter (alias `saturation-filter`): drops endpoints whose data is not usable or
    whose effective queue or KV usage is at or over threshold × (1 + headroom). If that would drop every candidate
    it keeps them all: a full pool still has to answer, and the scorers then pick the least bad endpoint."""

    type_name = "utilization-detector"

    def __init__(self, name: str = "utilization-detector", thresholds: SaturationThresholds | None = None) -> None:
        self.name = name
        self.thresholds = thresholds or SaturationThresholds()

    def filter(self, state: CycleState, candidates: IntArray) -> IntArray:
        t = self.thresholds
        factor = 1.0 + t.headroom
        queue_limit, kv_limit = t.queue_depth * factor, t.kv_util * factor
        fresh = state.usable(candidates)  # None: every candidate's data is usable
        queue, (_, busiest, _) = state.signal(Signal.EFFECTIVE_QUEUE, candidates)
        kv, (_, fullest, _) = state.signal(Signal.KV_USAGE, candidates)
        # The common case, from the pick's shared extremes: every candidate usable, none over a limit.
        if fresh is None and not over(busiest, fullest, queue_limit, kv_limit):
            return candidates
        kept = kept_under(candidates, queue, kv, fresh, queue_limit, kv_limit)
        return kept if 0 < kept.size < candidates.size else candidates


CONCURRENCY_MODES = ("requests", "tokens", "hybrid")


class ConcurrencyDetector:
    """Upstream's `concurrency-detector`: saturation from our own requests in flight, no scrape needed, so it leads
    the engines' metrics instead of lagging them. Three modes, upstream's:

    - `requests`: in-flight requests over the pool's capacity, sum / (maxConcurrency × endpoints);
    - `tokens`: in-flight prompt tokens (the table's per-endpoint tally, the same one the inflight-load producer
      reads) over sum / (maxTokenConcurrency × endpoints);
    - `hybrid`: per endpoint the larger of its request and token ratios, averaged over the pool (an endpoint full
      on either dimension shows even when another endpoint is full on the other).

    As a filter it drops endpoints at capacity × (1 + headroom) in flight (hybrid: either limit reached); unlike
    upstream it keeps every candidate if all would go, so a full pool still answers with its least bad endpoint."""

    type_name = "concurrency-detector"

    def __init__(
        self,
        name: str = "concurrency-detector",
        max_concurrency: int = 100,
        headroom: float = 0.0,
        mode: str = "requests",
        max_token_concurrency: int = 1_000_000,
    ):
        if mode not in CONCURRENCY_MODES:
            raise ValueError(f"concurrency mode {mode!r}: expected one of {', '.join(CONCURRENCY_MODES)}")
        self.name = name
        self.max_concurrency = max_concurrency
        self.max_token_concurrency = max_token_concurrency
        self.headroom = headroom
        self.mode = mode
        self.freshness = Freshness()

    def saturation(self, snapshot: Snapshot, candidates: IntArray, now: float) -> float:
        if candidates.size == 0:
            return 1.0
        if self.mode == "requests":
            return float(snapshot.inflight[candidates].sum()) / (self.max_concurrency * candidates.size)
        if self.mode == "tokens":
            return float(snapshot.inflight_tokens[candidates].sum()) / (self.max_token_concurrency * candidates.size)
        requests = snapshot.inflight[candidates] / self.max_concurrency
        tokens = snapshot.inflight_tokens[candidates] / self.max_token_concurrency
        return float(np.maximum(requests, tokens).mean())

    def saturated(self, snapshot: Snapshot, candidates: IntArray, now: float) -> bool:
        return self.saturation(snapshot, candidates, now) >= 1.0

    def filter(self, state: CycleState, candidates: IntArray) -> IntArray:
        snapshot = state.snapshot
        factor = 1.0 + self.headroom
        request_limit = int(self.max_concurrency * factor)  # whole requests and tokens, as upstream
        token_limit = int(self.max_token_concurrency * factor)
        if self.mode == "requests":
            admits = snapshot.inflight[candidates] < request_limit
        elif self.mode == "tokens":
            admits = snapshot.inflight_tokens[candidates] < token_limit
        else:
            admits = (snapshot.inflight[candidates] < request_limit) & (
                snapshot.inflight_tokens[candidates] < token_limit
            )
        kept = candidates[admits]
        return kept if 0 < kept.size < candidates.size else candidates
