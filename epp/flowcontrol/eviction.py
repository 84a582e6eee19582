"""In-flight eviction (`flowControl.enableEviction`, upstream's demand-driven reclamation): when a band with
queued requests is held back by the pool's saturation, sheddable requests already running on the model servers
are ended early to make room for it.

Upstream's rules (llm-d-router `flowcontrol/controller/internal/reclamation.go`, `flowcontrol/eviction`), kept:

- Victims: only requests with priority < 0 (`sheddable-eviction-filter`), lowest priority first and, within a
  priority, the most recently dispatched first: it has the least KV cache invested
  (`priority-then-time-eviction-order-policy`). A victim's priority is always strictly below the blocked band's,
  so a band never evicts its own kind.
- Trigger: a dispatch cycle that stops at a band whose ceiling the saturation reaches, that band having queued
  requests and a positive ceiling (a zero ceiling is a policy statement: no eviction can open it).
- Sizing, in the saturation's own units: target = saturation − ceiling; credit = saturation / requests in flight
  (a request's mean footprint); n = max(1, ceil((target − pending) / credit)), at most 2 per decision and at most
  the evictable count.
- Pacing, stop-and-wait: a decision runs only when every earlier revocation is confirmed (its stream ended) and a
  grace has passed since, so the next decision reads a saturation that shows the capacity it freed. The grace is
  the detector's lag: 10 ms for `concurrency-detector` (its count drops when the stream ends), else one scrape
  interval plus the staleness threshold plus 250 ms for the engine to free the KV cache. A revocation not
  confirmed within 10 s counts as confirmed (`timed_out`), so a hung stream cannot stop reclamation.

Pure decision code: no I/O, no clock (`now` is an argument). What an eviction does to the stream (an
ImmediateResponse 429 `evicted`, the booking released) is the protocol side's (`epp.director.flow`,
`epp.extproc.server`); this module only says which requests, when, and how many.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

EVICTION_FILTER = "sheddable-eviction-filter"
EVICTION_ORDER = "priority-then-time-eviction-order-policy"
EVICTED_REASON = "evicted"  # upstream's x-llm-d-request-dropped-reason for an evicted request
MAX_REVOCATIONS_PER_DECISION = 2
CONFIRMATION_TIMEOUT_S = 10.0
LEADING_SENSOR_GRACE_S = 0.010  # concurrency-detector: the gauge drops as the stream ends
ENGINE_RECLAIM_S = 0.250  # a scraped detector: the engine's abort and KV cache release before the next scrape


def confirmation_grace(leading_sensor: bool, scrape_interval_s: float, staleness_s: float) -> float:
    """How long a confirmed revocation still holds the next decision back: the detector's confirmation-to-
    visibility lag (upstream derives it the same way, it is not configurable)."""
    if leading_sensor:
        return LEADING_SENSOR_GRACE_S
    return scrape_interval_s + staleness_s + ENGINE_RECLAIM_S


def evictable(priority: int) -> bool:
    """`sheddable-eviction-filter`: only sheddable requests may be evicted."""
    return priority < 0


@dataclass(slots=True, eq=False)
class InFlight:
    """One evictable request running on a model server. `ticket` is whatever the caller ends it with."""

    ticket: object
    priority: int
    dispatched_at: float
    seq: int = 0
    tracked: bool = True

    def order(self) -> tuple[int, float, int]:
        """`priority-then-time-eviction-order-policy`: lowest priority, then newest dispatch, first."""
        return (self.priority, -self.dispatched_at, -self.seq)


@dataclass(slots=True)
class _Revocation:
    credit: float
    issued_at: float


@dataclass(slots=True)
class Reclaimer:
    """The evictable requests in flight and the reclamation controller over them. One owner calls it."""

    grace_s: float
    max_per_decision: int = MAX_REVOCATIONS_PER_DECISION
    confirmation_timeout_s: float = CONFIRMATION_TIMEOUT_S
    _heap: list[tuple[tuple[int, float, int], InFlight]] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _outstanding: dict[int, _Revocation] = field(default_factory=dict)  # victim's seq → its revocation
    _cooling: list[tuple[float, float]] = field(default_factory=list)  # (expires at, credit)
    evictable_count: int = 0
    pending_reclaim: float = 0.0  # credits of revocations outstanding or cooling, in saturation units
    reclaim_target: float = 0.0  # the last decision's saturation − ceiling
    issued: dict[int, int] = field(default_factory=dict)  # demand band's priority → revocations issued
    confirmed: int = 0
    timed_out: int = 0

    # -- tracking --------------------------------------------------------------------------------------------
    def track(self, ticket: object, priority: int, now: float) -> InFlight | None:
        """A request was dispatched: its handle when it may be evicted, else None (not tracked)."""
        if not evictable(priority):
            return None
        item = InFlight(ticket, priority, now, next(self._seq))
        heapq.heappush(self._heap, (item.order(), item))
        self.evictable_count += 1
        return item

    def untrack(self, item: InFlight, now: float) -> float | None:
        """The request's stream ended. For an evicted one that is the revocation's confirmation: returns the
        seconds from issue to confirmation (None otherwise). Idempotent."""
        if item.tracked:
            item.tracked = False  # lazily dropped from the heap
            self.evictable_count -= 1
        revocation = self._outstanding.pop(item.seq, None)
        if revocation is None:
            return None
        self._cooling.append((now + self.grace_s, revocation.credit))
        self.confirmed += 1
        return now - revocation.issued_at

    def victim_priority(self) -> int | None:
        """The priority of the next victim, or None when nothing is evictable."""
        heap = self._heap
        while heap and not heap[0][1].tracked:
            heapq.heappop(heap)
        return heap[0][1].priority if heap else None

    # -- pacing ----------------------------------------------------------------------------------------------
    def gate_open(self, now: float) -> bool:
        """Whether a decision may run: nothing outstanding, nothing cooling (timed-out revocations retired)."""
        for seq, revocation in list(self._outstanding.items()):
            if now - revocation.issued_at >= self.confirmation_timeout_s:
                del self._outstanding[seq]
                self._cooling.append((now + self.grace_s, revocation.credit))
                self.timed_out += 1
        if self._cooling:
            kept = [(at, credit) for at, credit in self._cooling if now < at]
            for at, credit in self._cooling:
                if now >= at:
                    self.pending_reclaim = max(0.0, self.pending_reclaim - credit)
            self._cooling = kept
        return not self._outstanding and not self._cooling

    def next_change(self) -> float | None:
        """When the gate can open next without an event (a cooling debit expires, a revocation times out)."""
        times = [at for at, _ in self._cooling]
        times += [r.issued_at + self.confirmation_timeout_s for r in self._outstanding.values()]
        return min(times, default=None)

    # -- decisions -------------------------------------------------------------------------------------------
    def reclaim(
        self, saturation: float, ceiling: float, demand_priority: int, in_flight: int, now: float
    ) -> list[InFlight]:
        """One sizing decision for the blocked band `demand_priority`; the caller has seen `gate_open` true in
        the same cycle. Returns the victims, already counted as outstanding: end each one's request."""
        if in_flight <= 0 or self.evictable_count <= 0:
            return []
        credit = saturation / in_flight
        if not credit > 0 or math.isinf(credit):
            return []
        self.reclaim_target = target = saturation - ceiling
        net = target - self.pending_reclaim
        if net < 0 or (net == 0 and self.pending_reclaim > 0):
            return []
        # unblocking needs strictly more than the deficit: at the boundary, one revocation rather than none
        n = min(max(1, math.ceil(net / credit)), self.max_per_decision, self.evictable_count)
        victims: list[InFlight] = []
        heap = self._heap
        while len(victims) < n:
            if self.victim_priority() is None:
                break
            _, item = heap[0]
            if item.priority >= demand_priority:  # lowest first: no later victim is below the bound either
                break
            heapq.heappop(heap)
            item.tracked = False
            self.evictable_count -= 1
            self._outstanding[item.seq] = _Revocation(credit, now)
            self.pending_reclaim += credit
            victims.append(item)
        if victims:
            self.issued[demand_priority] = self.issued.get(demand_priority, 0) + len(victims)
        return victims


def demand_band(
    bands: Iterable[tuple[int, int]], ceilings: Mapping[int, float], saturation: float, victim_priority: int
) -> tuple[int, float] | None:
    """The band eviction would make room for: walking the bands from the highest priority (`bands`: priority and
    queued count, highest first), the first with queued requests, a positive ceiling that the saturation reaches,
    and a priority strictly above the next victim's. None: no eligible demand."""
    for priority, queued in bands:
        if priority <= victim_priority:
            return None
        if queued == 0:
            continue
        ceiling = ceilings[priority]
        if ceiling <= 0 or saturation < ceiling:
            continue
        return priority, ceiling
    return None
