"""The pluggable parts of a band and of the dispatch rule, by upstream's type names.

- Ordering (within a flow): which waiting request comes first. `fcfs-ordering-policy` (arrival order),
  `edf-ordering-policy` (deadline = enqueue time + TTL), `slo-deadline-ordering-policy` (deadline = received +
  `x-llm-d-slo-ttft-ms`; a request without the header goes last).
- Fairness (between the flows of one band): which flow dispatches next. `global-strict-fairness-policy` (the band
  is one queue in the ordering policy's order), `round-robin-fairness-policy` (a cursor per band),
  `program-aware-fairness` with `strategy: las` (least attained service, decayed with a half-life, weighed against
  the head's wait).
- Usage limit (a ceiling per band on the pool's saturation): `static-usage-limit-policy` (one threshold),
  `priority-holdback-policy` (ceilings linear from maxCeiling for the highest band down to minCeiling),
  `soft-reflective-ceiling-policy` (ceiling[i] = 1 − i·sat/(N−1): the fuller the pool, the more the lower bands
  are held back).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from epp.flowcontrol.types import QueuedRequest


class OrderingPolicy(Protocol):
    @property
    def name(self) -> str: ...

    def key(self, item: QueuedRequest, default_ttl_s: float) -> float: ...


class FcfsOrdering:
    name = "fcfs-ordering-policy"

    def key(self, item: QueuedRequest, default_ttl_s: float) -> float:
        return item.enqueued_at


class EdfOrdering:
    name = "edf-ordering-policy"

    def key(self, item: QueuedRequest, default_ttl_s: float) -> float:
        ttl = default_ttl_s if item.ttl_s is None else item.ttl_s
        return item.enqueued_at + (ttl if ttl > 0 else math.inf)


class SloDeadlineOrdering:
    name = "slo-deadline-ordering-policy"

    def key(self, item: QueuedRequest, default_ttl_s: float) -> float:
        return item.slo_deadline


@dataclass(slots=True)
class FlowState:
    """What fairness policies may read about one flow of a band."""

    flow_id: str
    head_enqueued_at: float
    head_key: float
    attained: float = 0.0  # decayed service (dispatches), LAS only
    attained_at: float = 0.0


class FairnessPolicy(Protocol):
    @property
    def name(self) -> str: ...

    def choose(self, flows: Sequence[FlowState], now: float) -> FlowState: ...

    def dispatched(self, flow: FlowState, now: float) -> None: ...


class GlobalStrictFairness:
    """The band as one queue: the flow whose head comes first in the ordering policy's order."""

    name = "global-strict-fairness-policy"

    def choose(self, flows: Sequence[FlowState], now: float) -> FlowState:
        return min(flows, key=lambda f: f.head_key)

    def dispatched(self, flow: FlowState, now: float) -> None:
        pass


class RoundRobinFairness:
    """A cursor over the band's flows in fairness-id order: each non-empty flow in turn, wrapping."""

    name = "round-robin-fairness-policy"

    def __init__(self) -> None:
        self._last: str | None = None

    def choose(self, flows: Sequence[FlowState], now: float) -> FlowState:
        if self._last is not None:
            ids = [f.flow_id for f in flows]
            # flows come in a stable order; take the first after the last one served (wrapping)
            for i, fid in enumerate(ids):
                if fid > self._last:
                    return flows[i]
        return flows[0]

    def dispatched(self, flow: FlowState, now: float) -> None:
        self._last = flow.flow_id


@dataclass(slots=True)
class LasFairness:
    """`program-aware-fairness`, strategy `las`: the flow with the least attained service goes first, where
    service decays with `half_life_s`, weighed `w_service` against the head's wait (`w_head_wait`)."""

    w_service: float = 0.8
    w_head_wait: float = 0.2
    half_life_s: float = 60.0
    name: str = "program-aware-fairness"
    _service: dict[str, tuple[float, float]] = field(default_factory=dict)  # flow → (attained, at)

    def _attained(self, flow_id: str, now: float) -> float:
        value, at = self._service.get(flow_id, (0.0, now))
        if self.half_life_s <= 0:  # 0: no decay, service is cumulative
            return value
        return float(value * 0.5 ** (max(0.0, now - at) / self.half_life_s))

    def choose(self, flows: Sequence[FlowState], now: float) -> FlowState:
        services = [self._attained(f.flow_id, now) for f in flows]
        waits = [max(0.0, now - f.head_enqueued_at) for f in flows]
        top_s, top_w = max(services) or 1.0, max(waits) or 1.0
        scores = [
            self.w_service * s / top_s - self.w_head_wait * w / top_w for s, w in zip(services, waits, strict=True)
        ]
        return flows[min(range(len(flows)), key=lambda i: (scores[i], flows[i].head_key))]

    def dispatched(self, flow: FlowState, now: float) -> None:
        self._service[flow.flow_id] = (self._attained(flow.flow_id, now) + 1.0, now)


class UsageLimitPolicy(Protocol):
    @property
    def name(self) -> str: ...

    def ceilings(self, priorities: Sequence[int], saturation: float) -> Mapping[int, float]: ...


@dataclass(frozen=True, slots=True)
class StaticUsageLimit:
    threshold: float = 1.0
    name: str = "static-usage-limit-policy"

    def ceilings(self, priorities: Sequence[int], saturation: float) -> Mapping[int, float]:
        return dict.fromkeys(priorities, self.threshold)


@dataclass(frozen=True, slots=True)
class PriorityHoldback:
    """Ceilings linear from `max_ceiling` (highest band) down to `min_ceiling` (lowest), by rank or by value."""

    min_ceiling: float
    max_ceiling: float = 1.0
    by_value: bool = False
    name: str = "priority-holdback-policy"

    def ceilings(self, priorities: Sequence[int], saturation: float) -> Mapping[int, float]:
        ordered = sorted(priorities, reverse=True)
        if len(ordered) <= 1:
            return dict.fromkeys(ordered, self.max_ceiling)
        span = self.max_ceiling - self.min_ceiling
        if self.by_value:
            hi, lo = ordered[0], ordered[-1]
            return {p: self.min_ceiling + span * (p - lo) / (hi - lo) for p in ordered}
        n = len(ordered) - 1
        return {p: self.max_ceiling - span * i / n for i, p in enumerate(ordered)}


class SoftReflectiveCeiling:
    """ceiling[i] = 1 − i·sat/(N−1), i the band's rank from the highest: an idle pool lets every band through; a
    fuller pool holds the lower bands back in proportion (alpha upstream). A gated band is still opened on one call
    in every round(sat/(1−sat)) (one tick shared by all gated bands, so the ceilings stay monotone in rank), which
    spreads its dispatches at about (1−sat)/sat of the call rate instead of starving it."""

    name = "soft-reflective-ceiling-policy"

    def __init__(self) -> None:
        self._tick = 0

    def ceilings(self, priorities: Sequence[int], saturation: float) -> Mapping[int, float]:
        ordered = sorted(priorities, reverse=True)
        n = len(ordered) - 1
        sat = min(max(saturation, 0.0), 1.0)
        out = {p: 1.0 if n == 0 else 1.0 - i * sat / n for i, p in enumerate(ordered)}
        if 0.0 < sat < 1.0 and any(c <= saturation for c in out.values()):
            period = max(1, round(sat / (1.0 - sat)))
            self._tick += 1
            if self._tick % period == 0:
                out = {p: c if c > saturation else 1.0 for p, c in out.items()}
        return out


def ordering_policy(type_name: str) -> OrderingPolicy:
    """The ordering policy of a type name (an unknown name was refused by the config decoder: FCFS)."""
    if type_name == "edf-ordering-policy":
        return EdfOrdering()
    if type_name == "slo-deadline-ordering-policy":
        return SloDeadlineOrdering()
    return FcfsOrdering()


ORDERING_TYPES = ("fcfs-ordering-policy", "edf-ordering-policy", "slo-deadline-ordering-policy")
FAIRNESS_TYPES = ("global-strict-fairness-policy", "round-robin-fairness-policy", "program-aware-fairness")
USAGE_LIMIT_TYPES = ("static-usage-limit-policy", "priority-holdback-policy", "soft-reflective-ceiling-policy")
