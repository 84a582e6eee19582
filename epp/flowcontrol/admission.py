"""Admission plugins: a last word on a request before it is queued (or, gate off, scheduled), by upstream's type
names. Both always admit requests with priority ≥ 0 and an empty candidate set (the scheduler answers that).

- `probabilistic-admitter`: a sheddable request (priority < 0) is refused with probability
  p = min(saturation^power × k, 1), saturation being the admitter's own roofline (its `queueDepthThreshold` and
  `kvCacheUtilThreshold`). The random draw is an argument, so the rule stays pure and seeded.
- `latency-slo-admitter`: a sheddable request is admitted when an endpoint is idle (none of our requests in
  flight), or cold (KV < 2 %, where upstream's predictions are unreliable), or its latency SLO can still be met.
  Upstream asks a trained latency predictor for the last; we have none, so we use the queue itself: the SLO
  (`x-llm-d-slo-ttft-ms`) can be met while the oldest request of its band has waited less than the SLO (a request
  without the header always can).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from epp.datastore import Snapshot
from epp.datastore.table import IntArray
from epp.flowcontrol.gauge import Detector
from epp.flowcontrol.types import QueuedRequest

COLD_KV = 0.02


class Admitter(Protocol):
    @property
    def name(self) -> str: ...

    def admit(
        self,
        item: QueuedRequest,
        snapshot: Snapshot,
        candidates: IntArray,
        now: float,
        draw: float,
        oldest_wait_s: float,
    ) -> bool: ...


@dataclass(frozen=True, slots=True)
class ProbabilisticAdmitter:
    detector: Detector
    power: float = 5.0
    k: float = 300.0
    name: str = "probabilistic-admitter"

    def shed_probability(self, saturation: float) -> float:
        return float(min(max(saturation, 0.0) ** self.power * self.k, 1.0))

    def admit(
        self,
        item: QueuedRequest,
        snapshot: Snapshot,
        candidates: IntArray,
        now: float,
        draw: float,
        oldest_wait_s: float,
    ) -> bool:
        if item.priority >= 0 or candidates.size == 0:
            return True
        return draw >= self.shed_probability(self.detector.saturation(snapshot, candidates, now))


@dataclass(frozen=True, slots=True)
class LatencySloAdmitter:
    name: str = "latency-slo-admitter"

    def admit(
        self,
        item: QueuedRequest,
        snapshot: Snapshot,
        candidates: IntArray,
        now: float,
        draw: float,
        oldest_wait_s: float,
    ) -> bool:
        if item.priority >= 0 or candidates.size == 0:
            return True
        if bool(np.any(snapshot.inflight[candidates] == 0)):
            return True  # hasIdle
        if bool(np.any(snapshot.kv_usage[candidates] < COLD_KV)):
            return True  # hasCold (NaN compares False)
        return item.slo_ttft_s is None or oldest_wait_s < item.slo_ttft_s  # hasValid, from the queue
