"""`prefix-cache-affinity-filter`: keep the endpoints that already hold most of the prompt, until they are loaded.

Upstream's behaviour (`pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/README.md`):
- sticky = prefix-match ratio ≥ affinityThreshold (0.80); no sticky endpoint → all kept;
- with probability explorationProbability (0) the gate is skipped (all kept), so other endpoints warm up too;
- TTFT load gate: estimated TTFT = in-flight tokens / peakPrefillThroughput (15928 tokens/s) × 1000 ms; when the
  best (lowest) sticky estimate exceeds the best non-sticky one by more than maxTTFTPenaltyMs (18000; 0 = always
  stick), stickiness breaks and all are kept.
With `ttftSource: latencyPredictor` the estimate is the predicted-latency-producer's TTFT of this request on each
endpoint (the picker's own latency model), and the in-flight estimate above until it predicts anything;
calibration files are not read (decision code reads no file). Randomness is seeded per plugin, so a replay decides
the same.
"""

from __future__ import annotations

import numpy as np

from epp.datastore.table import IntArray
from epp.scheduling.framework import CycleState, PrefixMatch, produced
from epp.scheduling.producers import inflight_load
from epp.scheduling.slo import prediction_of


class PrefixCacheAffinityFilter:
    type_name = "prefix-cache-affinity-filter"

    def __init__(
        self,
        name: str = "prefix-cache-affinity-filter",
        threshold: float = 0.80,
        exploration: float = 0.0,
        max_penalty_ms: float = 18000.0,
        peak_prefill_tps: float = 15928.0,
        prefix_producer: str = "approx-prefix-cache-producer",
        load_producer: str = "inflight-load-producer",
        seed: int = 0,
        latency_producer: str = "",
    ) -> None:
        self.name = name
        self.threshold = threshold
        self.exploration = exploration
        self.max_penalty_ms = max_penalty_ms
        self.peak_prefill_tps = peak_prefill_tps
        self.prefix_producer = prefix_producer
        self.load_producer = load_producer
        self.latency_producer = latency_producer  # "": prefillThroughput
        self._rng = np.random.default_rng(seed)
        self.decisions = {"sticky": 0, "no_sticky": 0, "exploration": 0, "load_override": 0}

    def filter(self, state: CycleState, candidates: IntArray) -> IntArray:
        match: PrefixMatch | None = produced(state, self.prefix_producer)
        if match is None or candidates.size == 0:
            self.decisions["no_sticky"] += 1
            return candidates
        sticky = match.ratio(state, candidates) >= self.threshold
        if not sticky.any() or sticky.all():
            self.decisions["no_sticky" if not sticky.any() else "sticky"] += 1
            return candidates
        if self.exploration > 0.0 and self._rng.random() < self.exploration:
            self.decisions["exploration"] += 1
            return candidates
        if self.max_penalty_ms > 0.0:
            predicted = prediction_of(state, self.latency_producer, candidates) if self.latency_producer else None
            if predicted is not None:
                ttft_ms = predicted.ttft_ms
            else:
                load = inflight_load(state, self.load_producer).tokens
                ttft_ms = np.asarray(state.take(load, candidates), dtype=float) / self.peak_prefill_tps * 1000.0
            if float(ttft_ms[sticky].min()) - float(ttft_ms[~sticky].min()) > self.max_penalty_ms:
                self.decisions["load_override"] += 1
                return candidates
        self.decisions["sticky"] += 1
        return candidates[sticky]
