"""The pluggable parts of a band and of the dispatch rule, by upstream's type names.

- Ordering (within a flow): which waiting request comes first. `fcfs-ordering-policy` (arrival order),
  `edf-ordering-policy` (deadline = enqueue time + TTL), `slo-deadline-ordering-policy` (deadline = received +
  `x-llm-d-slo-ttft-ms`; a request without the header goes last).
- Fairness (between the flows of one band): which flow dispatches next. `global-strict-fairness-policy` (the band
  is one queue in the ordering policy's order), `round-robin-fairness-policy` (a cursor per band; ours: with
  `overShareCeiling` < 1 also a fair-share gate, `FairShareGate`), `program-aware-fairness` with `strategy: las`
  (least attained service, decayed with a half-life, weighed against the head's wait).
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

    def eligible(
        self, flows: Sequence[FlowState], saturation: float, ceiling: float, now: float
    ) -> Sequence[FlowState]:
        """The waiting flows that may dispatch at this saturation, under the band's `ceiling` (already below it)."""
        ...

    def choose(self, flows: Sequence[FlowState], now: float) -> FlowState: ...

    def dispatched(self, flow: FlowState, now: float) -> None: ...


class DecayedService:
    """Dispatches per flow, decayed with a half-life (0: no decay): the service LAS ranks flows by and the fair-share
    gate compares with an equal share. Flows whose service decayed below `_FORGET` are forgotten (flow churn)."""

    _FORGET = 0.01

    def __init__(self, half_life_s: float) -> None:
        self.half_life_s = half_life_s
        self._service: dict[str, tuple[float, float]] = {}  # flow → (attained, at)

    def _decayed(self, value: float, at: float, now: float) -> float:
        if self.half_life_s <= 0:
            return value
        return float(value * 0.5 ** (max(0.0, now - at) / self.half_life_s))

    def of(self, flow_id: str, now: float) -> float:
        value, at = self._service.get(flow_id, (0.0, now))
        return self._decayed(value, at, now)

    def add(self, flow_id: str, now: float) -> None:
        self._service[flow_id] = (self.of(flow_id, now) + 1.0, now)

    def shares(self, now: float) -> dict[str, float]:
        """Every remembered flow's service now (forgetting those decayed to nothing)."""
        out = {}
        for fid, (value, at) in list(self._service.items()):
            v = self._decayed(value, at, now)
            if v < self._FORGET:
                del self._service[fid]
            else:
                out[fid] = v
        return out


class GlobalStrictFairness:
    """The band as one queue: the flow whose head comes first in the ordering policy's order."""

    name = "global-strict-fairness-policy"

    def eligible(
        self, flows: Sequence[FlowState], saturation: float, ceiling: float, now: float
    ) -> Sequence[FlowState]:
        return flows

    def choose(self, flows: Sequence[FlowState], now: float) -> FlowState:
        return min(flows, key=lambda f: f.head_key)

    def dispatched(self, flow: FlowState, now: float) -> None:
        pass


class FairShareGate:
    """Ours (upstream has no such gate): a flow that has had more than an equal share of its band's recent
    dispatches (service decayed with `half_life_s`; the flows sharing are those dispatched recently or waiting) may
    dispatch only below `over_share` × the band's ceiling; a flow at or under its share, up to the ceiling itself.

    Round-robin orders the flows that wait, but a light flow's request rarely waits long enough to take its turn:
    it arrives at a pool the heavy flow keeps at the ceiling and lands on engines busy with the heavy flow's work.
    The gate keeps headroom the over-share flow pays for, so an under-share flow's request always finds room."""

    def __init__(self, over_share: float, half_life_s: float) -> None:
        self.over_share = over_share
        self.service = DecayedService(half_life_s)

    def admits(self, flow_id: str, waiting: Sequence[str], saturation: float, ceiling: float, now: float) -> bool:
        if saturation < ceiling * self.over_share:
            return True
        shares = self.service.shares(now)
        for fid in waiting:
            shares.setdefault(fid, 0.0)
        total = sum(shares.values())
        return total <= 0 or shares[flow_id] * len(shares) <= total

    def dispatched(self, flow_id: str, now: float) -> None:
        self.service.add(flow_id, now)


class RoundRobinFairness:
    """A cursor over the band's flows in fairness-id order: each non-empty flow in turn, wrapping; a flow the fair-
    share gate holds (`over_share` < 1) is skipped."""

    name = "round-robin-fairness-policy"

    def __init__(self, over_share: float = 1.0, share_half_life_s: float = 10.0) -> None:
        self._last: str | None = None
        self.gate = FairShareGate(over_share, share_half_life_s) if over_share < 1.0 else None

    def eligible(
        self, flows: Sequence[FlowState], saturation: float, ceiling: float, now: float
    ) -> Sequence[FlowState]:
        gate = self.gate
        if gate is None or saturation < ceiling * gate.over_share:
            return flows
        ids = [f.flow_id for f in flows]
        return [f for f in flows if gate.admits(f.flow_id, ids, saturation, ceiling, now)]

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
        if self.gate is not None:
            self.gate.dispatched(flow.flow_id, now)


@dataclass(slots=True)
class LasFairness:
    """`program-aware-fairness`, strategy `las`: the flow with the least attained service goes first, where
    service decays with `half_life_s`, weighed `w_service` against the head's wait (`w_head_wait`)."""

    w_service: float = 0.8
    w_head_wait: float = 0.2
    half_life_s: float = 60.0
    name: str = "program-aware-fairness"
    _service: DecayedService = field(init=False)

    def __post_init__(self) -> None:
        self._service = DecayedService(self.half_life_s)  # 0: no decay, service is cumulative

    def eligible(
        self, flows: Sequence[FlowState], saturation: float, ceiling: float, now: float
    ) -> Sequence[FlowState]:
        return flows

    def choose(self, flows: Sequence[FlowState], now: float) -> FlowState:
        services = [self._service.of(f.flow_id, now) for f in flows]
        waits = [max(0.0, now - f.head_enqueued_at) for f in flows]
        top_s, top_w = max(services) or 1.0, max(waits) or 1.0
        scores = [
            self.w_service * s / top_s - self.w_head_wait * w / top_w for s, w in zip(services, waits, strict=True)
        ]
        return flows[min(range(len(flows)), key=lambda i: (scores[i], flows[i].head_key))]

    def dispatched(self, flow: FlowState, now: float) -> None:
        self._service.add(flow.flow_id, now)


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
