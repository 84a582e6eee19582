"""The flow controller: bands by priority, flows by fairness id, caps, TTLs and the dispatch rule.

Dispatch is upstream's (llm-d-router `flowcontrol/controller/internal/processor.go`): bands are walked from the
highest priority down; at the first non-empty band whose ceiling (the usage-limit policy's) the pool's saturation
reaches, the walk stops — head-of-line blocking, so a lower band never overtakes a held-back higher one. Otherwise
the band's fairness policy picks a flow and the band's ordering policy that flow's next request.

What saturation means is the caller's (`epp.director.flow`): ours counts our own picks since the last scrape, so a
burst cannot overshoot between scrapes. The controller never reads a clock: every method takes `now`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from epp.config.flowcontrol import FlowControlSpec, PriorityBandSpec
from epp.flowcontrol.policies import (
    FairnessPolicy,
    FlowState,
    GlobalStrictFairness,
    OrderingPolicy,
    StaticUsageLimit,
    UsageLimitPolicy,
    ordering_policy,
)
from epp.flowcontrol.types import Outcome, QueuedRequest

FairnessFactory = Callable[[str], FairnessPolicy]


@dataclass(slots=True)
class FlowSettings:
    """The controller's configuration: the decoded `flowControl:` section and the policy objects it names."""

    spec: FlowControlSpec = field(default_factory=FlowControlSpec)
    usage_limit: UsageLimitPolicy = field(default_factory=StaticUsageLimit)
    # a fairness policy object per band, by the band's fairnessPolicyRef (each band gets its own: cursors, service)
    fairness: FairnessFactory = field(default=lambda ref: GlobalStrictFairness())
    ordering: Callable[[str], OrderingPolicy] = field(default=ordering_policy)


class _Flow:
    __slots__ = ("bytes", "count", "heap", "state")

    def __init__(self, flow_id: str) -> None:
        self.heap: list[tuple[float, int, QueuedRequest]] = []
        self.count = 0
        self.bytes = 0
        self.state = FlowState(flow_id, 0.0, 0.0)

    def head(self) -> QueuedRequest | None:
        heap = self.heap
        while heap and not heap[0][2].alive:
            heapq.heappop(heap)
        return heap[0][2] if heap else None


class Band:
    """One priority level: its caps, its flows and its two policies."""

    def __init__(self, spec: PriorityBandSpec, priority: int, fairness: FairnessPolicy, ordering: OrderingPolicy):
        self.priority = priority
        self.max_requests = spec.max_requests
        self.max_bytes = spec.max_bytes
        self.fairness = fairness
        self.ordering = ordering
        self.flows: dict[str, _Flow] = {}
        self.count = 0
        self.bytes = 0

    def flow_states(self) -> list[FlowState]:
        states = []
        for fid in sorted(self.flows):
            flow = self.flows[fid]
            head = flow.head()
            if head is None:
                continue
            flow.state.head_enqueued_at = head.enqueued_at
            flow.state.head_key = flow.heap[0][0]
            states.append(flow.state)
        return states


@dataclass(frozen=True, slots=True)
class BandStats:
    priority: int
    requests: int
    bytes: int
    oldest_enqueued_at: float | None
    flows: dict[str, tuple[int, int]]  # fairness id → (requests, bytes)


class FlowController:
    """The queues. Not thread-safe and not async: one owner (the dispatch loop or the benchmark) calls it."""

    def __init__(self, settings: FlowSettings | None = None) -> None:
        self.settings = settings = settings or FlowSettings()
        self._spec = settings.spec
        self._bands: dict[int, Band] = {}
        self._order: list[int] = []  # priorities, highest first
        self._items: dict[int, QueuedRequest] = {}  # seq → live item
        self._seq = itertools.count(1)
        self._deadlines: list[tuple[float, int]] = []  # (expiry, seq), lazily cleaned
        self.count = 0
        self.bytes = 0
        self.pool_empty = False
        self.last_ceilings: dict[int, float] = {}  # the ceilings the last dispatch cycle read (eviction's demand)
        for band in settings.spec.bands:
            self._band(band.priority)

    # -- bands -----------------------------------------------------------------------------------------------
    def band(self, priority: int) -> Band:
        return self._band(priority)

    def _band(self, priority: int) -> Band:
        band = self._bands.get(priority)
        if band is None:
            spec = next((b for b in self._spec.bands if b.priority == priority), None)
            if spec is None:  # created on demand from the template
                neg = self._spec.default_negative_band
                spec = neg if priority < 0 and neg is not None else self._spec.default_band
            band = Band(
                spec,
                priority,
                self.settings.fairness(spec.fairness_policy_ref),
                self.settings.ordering(spec.ordering_policy_ref),
            )
            self._bands[priority] = band
            self._order = sorted(self._bands, reverse=True)
        return band

    def ttl_of(self, item: QueuedRequest) -> float:
        """The item's queue-wait budget in the current regime; 0 means no expiry."""
        if self.pool_empty:
            return self._spec.no_endpoint_request_ttl_s
        return self._spec.default_request_ttl_s if item.ttl_s is None else item.ttl_s

    def _push_deadline(self, item: QueuedRequest) -> None:
        ttl = self.ttl_of(item)
        if ttl > 0:
            heapq.heappush(self._deadlines, (item.budget_from + ttl, item.seq))

    # -- arrivals --------------------------------------------------------------------------------------------
    def enqueue(self, item: QueuedRequest, now: float) -> Outcome | None:
        """Queue a request: None when it waits, else the outcome it gets at once (capacity, empty pool)."""
        if self.pool_empty and self._spec.no_endpoint_request_ttl_s <= 0:
            return Outcome.REJECTED_NO_ENDPOINTS
        spec = self._spec
        if spec.max_requests and self.count + 1 > spec.max_requests:
            return Outcome.REJECTED_CAPACITY
        if spec.max_bytes and self.bytes + item.size > spec.max_bytes:
            return Outcome.REJECTED_CAPACITY
        band = self._band(item.priority)
        if band.max_requests and band.count + 1 > band.max_requests:
            return Outcome.REJECTED_CAPACITY
        if band.max_bytes and band.bytes + item.size > band.max_bytes:
            return Outcome.REJECTED_CAPACITY
        item.seq = next(self._seq)
        item.enqueued_at = now
        item.budget_from = now
        item.alive = True
        flow = band.flows.get(item.flow_id)
        if flow is None:
            flow = band.flows[item.flow_id] = _Flow(item.flow_id)
        heapq.heappush(flow.heap, (band.ordering.key(item, spec.default_request_ttl_s), item.seq, item))
        flow.count += 1
        flow.bytes += item.size
        band.count += 1
        band.bytes += item.size
        self.count += 1
        self.bytes += item.size
        self._items[item.seq] = item
        self._push_deadline(item)
        return None

    def _remove(self, item: QueuedRequest) -> None:
        item.alive = False
        del self._items[item.seq]
        band = self._bands[item.priority]
        flow = band.flows[item.flow_id]
        flow.count -= 1
        flow.bytes -= item.size
        band.count -= 1
        band.bytes -= item.size
        self.count -= 1
        self.bytes -= item.size
        if flow.count == 0:  # flow churn: an idle flow leaves no state behind (its LAS service stays in the policy)
            del band.flows[item.flow_id]

    def cancel(self, item: QueuedRequest) -> bool:
        """The caller went away: its place is freed at once. False if it was no longer queued."""
        if not item.alive or item.seq not in self._items:
            return False
        self._remove(item)
        return True

    # -- dispatch --------------------------------------------------------------------------------------------
    def ceilings(self, saturation: float) -> dict[int, float]:
        return dict(self.settings.usage_limit.ceilings(self._order, saturation))

    def pass_through(self, item: QueuedRequest, saturation: float, now: float) -> bool:
        """A request that would wait behind nothing (the queue is empty): True when its band's ceiling and
        fairness policy let it go now, and then its dispatch is counted as the policy's (the fair-share gate's
        service); False when it must be queued."""
        band = self._band(item.priority)
        ceiling = self.ceilings(saturation)[item.priority]
        if saturation >= ceiling:
            return False
        state = FlowState(item.flow_id, now, now)
        if not band.fairness.eligible([state], saturation, ceiling, now):
            return False
        band.fairness.dispatched(state, now)
        return True

    def dispatch(self, saturation: float, now: float) -> QueuedRequest | None:
        """One cycle: the next request to send on, or None (nothing queued, or held back by saturation)."""
        if self.count == 0 or self.pool_empty:
            return None
        self.last_ceilings = ceilings = self.ceilings(saturation)
        for priority in self._order:
            band = self._bands[priority]
            if band.count == 0:
                continue
            ceiling = ceilings[priority]
            if saturation >= ceiling:
                return None  # head-of-line: lower bands wait behind this one
            flows = band.fairness.eligible(band.flow_states(), saturation, ceiling, now)
            if not flows:
                return None  # every waiting flow of the band is over its fair share: held, head-of-line too
            chosen = band.fairness.choose(flows, now)
            flow = band.flows[chosen.flow_id]
            head = flow.head()
            assert head is not None
            heapq.heappop(flow.heap)
            band.fairness.dispatched(chosen, now)
            self._remove(head)
            return head
        return None

    # -- time ------------------------------------------------------------------------------------------------
    def set_pool_empty(self, empty: bool, now: float) -> None:
        """The pool gained or lost its last endpoint: a change of regime grants every waiter a fresh budget."""
        if empty == self.pool_empty:
            return
        self.pool_empty = empty
        self._deadlines = []
        for item in self._items.values():
            item.budget_from = now
            self._push_deadline(item)

    def next_expiry(self) -> float | None:
        """When the earliest waiter's budget runs out (for the dispatch loop's one timer); None: never."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][1] not in self._items:
            heapq.heappop(deadlines)
        return deadlines[0][0] if deadlines else None

    def expire(self, now: float) -> list[tuple[QueuedRequest, Outcome]]:
        """Waiters whose budget ran out, with their outcome (503 no-endpoints while the pool is empty)."""
        out: list[tuple[QueuedRequest, Outcome]] = []
        outcome = Outcome.REJECTED_NO_ENDPOINTS if self.pool_empty else Outcome.EVICTED_TTL
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, seq = heapq.heappop(deadlines)
            item = self._items.get(seq)
            if item is not None and item.budget_from + self.ttl_of(item) <= now:
                self._remove(item)
                out.append((item, outcome))
        return out

    def drain(self) -> list[QueuedRequest]:
        """Shutdown: every waiter, removed (each then gets 503 rejected-shutting-down; none is dropped)."""
        items = sorted(self._items.values(), key=lambda i: i.seq)
        for item in items:
            self._remove(item)
        return items

    # -- observation -----------------------------------------------------------------------------------------
    def band_counts(self) -> list[tuple[int, int]]:
        """(priority, queued requests) of every band, highest priority first (in-flight eviction's demand)."""
        return [(p, self._bands[p].count) for p in self._order]

    def oldest_enqueued_at(self, priority: int) -> float | None:
        band = self._bands.get(priority)
        if band is None or band.count == 0:
            return None
        return min(i.enqueued_at for i in self._items.values() if i.priority == priority)

    def waiting(self) -> Iterator[QueuedRequest]:
        return iter(list(self._items.values()))

    def stats(self) -> list[BandStats]:
        out = []
        for priority in self._order:
            band = self._bands[priority]
            oldest = min((i.enqueued_at for i in self._items.values() if i.priority == priority), default=None)
            out.append(
                BandStats(
                    priority,
                    band.count,
                    band.bytes,
                    oldest,
                    {fid: (f.count, f.bytes) for fid, f in sorted(band.flows.items())},
                )
            )
        return out
