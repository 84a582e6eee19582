"""Flow control on the serving path: a request waits in the queues (`epp.flowcontrol`) while the pool is
saturated, and its ext_proc stream stays open meanwhile.

One dispatch task, no thread and no busy loop. Each waiting request is an asyncio Future in the controller; the
task runs a cycle when something can have changed — an arrival, the end of a request in flight (`wake`, called by
the director), new scrape data (the table's scrape listener) — and otherwise sleeps until the earliest TTL expiry,
or, while requests are held back, until its data can have gone stale. A cycle hands out at most one dispatch and
waits until that request has been decided and its pick booked in flight (`decided`): the next cycle then reads a
saturation that counts it (`epp.flowcontrol.gauge`), so a burst cannot overshoot between two scrapes.

A client that goes away (its stream cancelled) leaves the queue at once. Outcomes become EppErrors with upstream's
status and `x-llm-d-request-dropped-reason` (`epp.flowcontrol.types.Outcome`). On shutdown (`shutdown`) new
arrivals get 503 `rejected-shutting-down`; the queue keeps dispatching for the grace period, and whatever is left
then gets the same 503: every queued request is answered, none is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from epp import wire
from epp.datastore import EndpointTable, usable
from epp.datastore.objectives import ObjectiveStore
from epp.errors import EppError, ErrorCode
from epp.flowcontrol import FlowController, Outcome, QueuedRequest
from epp.flowcontrol.admission import Admitter
from epp.flowcontrol.eviction import EVICTED_REASON, InFlight, Reclaimer, demand_band
from epp.flowcontrol.gauge import PoolGauge
from epp.flowcontrol.types import DEFAULT_FLOW
from epp.observability.flow import EvictionState, QueueState
from epp.requests.openai import control_headers
from epp.supervision.loop import wait_set

log = logging.getLogger(__name__)

_CODES = {429: ErrorCode.RESOURCE_EXHAUSTED, 503: ErrorCode.SERVICE_UNAVAILABLE}
_WORDS = {
    Outcome.REJECTED_CAPACITY: "flow-control queue full",
    Outcome.REJECTED_NO_ENDPOINTS: "no ready endpoint in the pool",
    Outcome.EVICTED_TTL: "queued longer than its TTL while the pool was saturated",
    Outcome.EVICTED_CANCELLED: "the client went away while queued",
    Outcome.REJECTED_SHUTDOWN: "the endpoint picker is shutting down",
    Outcome.REJECTED_ADMISSION: "pool saturated: sheddable request refused by admission",
}


def outcome_error(outcome: Outcome) -> EppError:
    return EppError(_CODES[outcome.status], _WORDS[outcome], outcome.reason)


# Upstream answers an evicted request 429 with the reason `evicted` (its ImmediateResponseEvictor).
EVICTED = EppError(
    ErrorCode.RESOURCE_EXHAUSTED,
    "request evicted by flow control: a higher-priority request needed room",
    EVICTED_REASON,
)


class FlowObserver(Protocol):
    """What flow control reports (the metrics implement it; a no-op by default)."""

    def flow_outcome(self, outcome: Outcome, fairness_id: str, priority: int, waited_s: float) -> None: ...

    def flow_cycle(self, seconds: float, saturation: float) -> None: ...

    def flow_revocation_confirmed(self, seconds: float) -> None: ...


class _NullObserver:
    def flow_outcome(self, outcome: Outcome, fairness_id: str, priority: int, waited_s: float) -> None:
        pass

    def flow_cycle(self, seconds: float, saturation: float) -> None:
        pass

    def flow_revocation_confirmed(self, seconds: float) -> None:
        pass


class FlowHold(Protocol):
    """What the decision pipeline and the director ask of flow control: this process's `FlowGate`, or, in a serving
    worker, the control process's gate over the kit's pipe (`epp.director.flow_link.RemoteFlowGate`)."""

    def hold(self, headers: Mapping[str, str], size: int) -> AsyncGenerator[float, None]: ...

    def decided(self) -> None: ...

    def wake(self) -> None: ...

    @property
    def evicting(self) -> bool: ...

    def track(self, headers: Mapping[str, str], evict: Callable[[], None]) -> Any: ...

    def untrack(self, item: Any) -> None: ...


def queued_item(headers: Mapping[str, str], size: int, now: float, objectives: ObjectiveStore | None) -> QueuedRequest:
    """The queue's view of a request: its priority (its objective's), fairness id, size, arrival and TTFT SLO."""
    control = control_headers(headers)
    priority = objectives.priority_of(control.objective) if objectives is not None else 0
    slo = control.slo_ttft_ms / 1000.0 if control.slo_ttft_ms is not None else None
    return QueuedRequest(
        ticket=None,
        flow_id=control.fairness_id or DEFAULT_FLOW,
        priority=priority,
        size=size,
        received_at=now,
        slo_ttft_s=slo,
    )


@dataclass(slots=True, eq=False)
class Waiter:
    """A request waiting in the queue: its item, the future its outcome arrives on, and when it arrived."""

    item: QueuedRequest
    future: asyncio.Future[Outcome]
    since: float
    settled: bool = False


class FlowGate:
    def __init__(
        self,
        controller: FlowController,
        table: EndpointTable,
        gauge: PoolGauge,
        clock: Callable[[], float],
        objectives: ObjectiveStore | None = None,
        admitters: Sequence[Admitter] = (),
        observer: FlowObserver | None = None,
        seed: int | None = None,
        reclaimer: Reclaimer | None = None,
    ) -> None:
        """`reclaimer` is in-flight eviction (`enableEviction`); None: off."""
        self.controller = controller
        self._table = table
        self._gauge = gauge
        self._clock = clock
        self._objectives = objectives
        self._admitters = tuple(admitters)
        self.observer: FlowObserver = observer or _NullObserver()
        self._rng = random.Random(seed)
        self._granted = 0  # dispatched (or let through) and not yet decided
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.saturation = 0.0  # the last value a cycle read (for /debug/pool and the metrics)
        self.reclaimer = reclaimer
        table.add_scrape_listener(self.wake)

    # -- the request side ------------------------------------------------------------------------------------
    def item_of(self, headers: Mapping[str, str], size: int, now: float) -> QueuedRequest:
        return queued_item(headers, size, now, self._objectives)

    async def admit(self, headers: Mapping[str, str], size: int) -> None:
        """Return when the request may be scheduled (then call `decided` once it was); raise EppError when it is
        refused. The caller decides synchronously after this returns, so its pick is booked before the next
        cycle. `enter` and `wait` are the same in two steps, and `hold` the same with a reminder while it waits."""
        waiter = self.enter(headers, size)
        if waiter is not None:
            await self.wait(waiter)

    async def hold(self, headers: Mapping[str, str], size: int) -> AsyncGenerator[float, None]:
        """The hold loop of a stream: ends when the request may be scheduled (then call `decided` once it was),
        raises EppError when it is refused. While the request waits in the queue it yields the seconds Envoy
        should keep waiting for the answer (its per-message timer runs meanwhile), at once and then every half of
        that, so only the TTL (or the client) ends the wait. Closed early, its stream gone, the request leaves
        the queue."""
        waiter = self.enter(headers, size)
        if waiter is None:
            return
        try:
            yield wire.QUEUE_HOLD_S
            while not await self.wait(waiter, wire.QUEUE_HOLD_S / 2):
                yield wire.QUEUE_HOLD_S
        finally:
            self.abandon(waiter)  # a no-op once the outcome was read

    def enter(self, headers: Mapping[str, str], size: int) -> Waiter | None:
        """The request arrives: None when it may be scheduled now; a Waiter when it waits in the queue (then
        `wait` on it); raises EppError when it is refused at once (capacity, admission, shutting down)."""
        now = self._clock()
        arrived = self.arrive(self.item_of(headers, size, now), now)
        if isinstance(arrived, Outcome):
            raise outcome_error(arrived)
        return arrived

    def arrive(self, item: QueuedRequest, now: float) -> Waiter | Outcome | None:
        """`enter` for a request already made an item (here, or by a serving worker, `epp.app.flow_host`): None
        when it may be scheduled now, a Waiter when it waits, the Outcome when it is refused at once."""
        if self._closing:
            self.observer.flow_outcome(Outcome.REJECTED_SHUTDOWN, item.flow_id, item.priority, 0.0)
            return Outcome.REJECTED_SHUTDOWN
        fc = self.controller
        snapshot = self._table.view()
        candidates = snapshot.slots
        fc.set_pool_empty(candidates.size == 0, now)
        if self._admitters:
            oldest = fc.oldest_enqueued_at(item.priority)
            wait = now - oldest if oldest is not None else 0.0
            for admitter in self._admitters:
                if not admitter.admit(item, snapshot, candidates, now, self._rng.random(), wait):
                    self.observer.flow_outcome(Outcome.REJECTED_ADMISSION, item.flow_id, item.priority, 0.0)
                    return Outcome.REJECTED_ADMISSION
        if fc.count == 0 and self._granted == 0 and not fc.pool_empty:  # the common case: nothing waits
            saturation = self._gauge.saturation(snapshot, candidates, now)
            if fc.pass_through(item, saturation, now):
                self._granted += 1
                self.observer.flow_outcome(Outcome.DISPATCHED, item.flow_id, item.priority, 0.0)
                return None
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        item.ticket = future
        refused = fc.enqueue(item, now)
        if refused is not None:
            self.observer.flow_outcome(refused, item.flow_id, item.priority, 0.0)
            return refused
        self.wake()
        return Waiter(item, future, now)

    async def wait(self, waiter: Waiter, timeout: float | None = None) -> bool:
        """Wait for the queued request's outcome, at most `timeout` seconds (None: until it comes): True when it
        may be scheduled now (then call `decided`), False when it still waits; raises EppError when it was
        refused. If the caller is cancelled meanwhile, the request leaves the queue at once."""
        try:
            done, _ = await asyncio.wait((waiter.future,), timeout=timeout)
        except asyncio.CancelledError:
            self.abandon(waiter)
            raise
        if not done:
            return False
        outcome = self.settle(waiter)
        if outcome is not Outcome.DISPATCHED:
            raise outcome_error(outcome)
        return True

    def settle(self, waiter: Waiter) -> Outcome:
        """The outcome of a waiter whose future is done, counted by the observer (then `abandon` is a no-op)."""
        waiter.settled = True
        outcome = waiter.future.result()
        item = waiter.item
        self.observer.flow_outcome(outcome, item.flow_id, item.priority, self._clock() - waiter.since)
        return outcome

    def abandon(self, waiter: Waiter) -> None:
        """The caller stopped waiting (its stream went away): free the request's place, or, if it had just been
        dispatched, its grant. Idempotent, and a no-op once `wait` returned the outcome."""
        if waiter.settled:
            return
        waiter.settled = True
        future = waiter.future
        if future.done() and not future.cancelled():
            if future.result() is Outcome.DISPATCHED:
                self.decided()  # dispatched, then the client left before deciding
            return
        future.cancel()
        item = waiter.item
        if self.controller.cancel(item):
            self.observer.flow_outcome(
                Outcome.EVICTED_CANCELLED, item.flow_id, item.priority, self._clock() - waiter.since
            )
            self.wake()

    # -- in flight (eviction) ---------------------------------------------------------------------------------
    @property
    def evicting(self) -> bool:
        """In-flight eviction is on (`enableEviction`)."""
        return self.reclaimer is not None

    def track(self, headers: Mapping[str, str], evict: Callable[[], None]) -> InFlight | None:
        """A request this gate let through is now in flight. With eviction on and a sheddable priority: its
        handle (call `untrack` when its stream ends, whatever the reason); `evict` is how the dispatch task ends
        it early. None: it cannot be evicted."""
        if self.reclaimer is None:
            return None
        priority = self._objectives.priority_of(control_headers(headers).objective) if self._objectives else 0
        return self.track_at(priority, evict)

    def track_at(self, priority: int, evict: Callable[[], None]) -> InFlight | None:
        """`track` for a request whose priority is known (a serving worker's, `epp.app.flow_host`)."""
        reclaimer = self.reclaimer
        return None if reclaimer is None else reclaimer.track(evict, priority, self._clock())

    def untrack(self, item: InFlight) -> None:
        """The stream of a tracked request ended: for an evicted one, the revocation's confirmation."""
        assert self.reclaimer is not None
        seconds = self.reclaimer.untrack(item, self._clock())
        if seconds is not None:
            self.observer.flow_revocation_confirmed(seconds)
            self.wake()  # the pacing gate may have moved

    def _reclaim(self, saturation: float, in_flight: int, now: float) -> None:
        """A cycle stopped at a held-back band: end sheddable requests in flight to make room, when upstream's
        trigger, sizing and pacing say so (`epp.flowcontrol.eviction`)."""
        reclaimer = self.reclaimer
        if reclaimer is None or not reclaimer.gate_open(now):
            return
        victim = reclaimer.victim_priority()
        if victim is None:
            return
        fc = self.controller
        demand = demand_band(fc.band_counts(), fc.last_ceilings, saturation, victim)
        if demand is None:
            return
        priority, ceiling = demand
        for item in reclaimer.reclaim(saturation, ceiling, priority, in_flight, now):
            evict = item.ticket
            assert callable(evict)
            evict()

    def decided(self) -> None:
        """The request let through by `admit` has been decided (booked in flight, or refused)."""
        if self._granted > 0:
            self._granted -= 1
        self.wake()

    def wake(self) -> None:
        if self.controller.count:
            self._wakeup.set()

    # -- the dispatch task -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="flow-control dispatch")

    async def _run(self) -> None:
        while True:
            self._wakeup.clear()
            timeout = self.cycle()
            if timeout is None:
                await self._wakeup.wait()
                continue
            await wait_set(self._wakeup, timeout)  # not wait_for: a cancel as a worker's message lands must end this

    def cycle(self) -> float | None:
        """Expire, then dispatch at most one request; returns the seconds until the next timed check (None: wait
        for a wake-up)."""
        fc = self.controller
        started = now = self._clock()
        snapshot = self._table.view()
        candidates = snapshot.slots
        fc.set_pool_empty(candidates.size == 0, now)
        for expired, outcome in fc.expire(now):
            _resolve(expired, outcome)
        blocked = False
        if self._granted == 0 and fc.count:
            self.saturation = saturation = self._gauge.saturation(snapshot, candidates, now)
            while True:
                item = fc.dispatch(saturation, now)
                if item is None:
                    blocked = fc.count > 0
                    break
                if _resolve(item, Outcome.DISPATCHED):
                    self._granted += 1
                    break
            if blocked and self.reclaimer is not None:
                self._reclaim(saturation, int(snapshot.inflight[candidates].sum()), now)
            self.observer.flow_cycle(self._clock() - started, saturation)
        if not fc.count:
            return None
        waits: list[float] = []
        expiry = fc.next_expiry()
        if expiry is not None:
            waits.append(expiry - now)
        if blocked:  # held back: data may go stale (the gauge's fallback then changes its reading)
            waits.append(self._gauge.freshness.staleness_s)
            change = self.reclaimer.next_change() if self.reclaimer is not None else None
            if change is not None:  # eviction's pacing gate may open
                waits.append(max(0.0, change - now))
        return min(waits) if waits else None

    async def shutdown(self, grace_s: float) -> None:
        """Refuse new arrivals; let the queue drain for `grace_s`; answer what is left with 503."""
        self._closing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self.controller.count and loop.time() < deadline:
            self.wake()
            await asyncio.sleep(min(0.05, max(0.0, deadline - loop.time())))
        for item in self.controller.drain():
            _resolve(item, Outcome.REJECTED_SHUTDOWN)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    # -- observation -----------------------------------------------------------------------------------------
    def queue_state(self) -> QueueState:
        """For the metrics at scrape time."""
        fc = self.controller
        spec = fc.settings.spec
        flows, bands = [], []
        for s in fc.stats():
            flows += [(fid, s.priority, r, b) for fid, (r, b) in s.flows.items()]
            band = fc.band(s.priority)
            bands.append(
                (
                    s.priority,
                    s.requests / band.max_requests if band.max_requests else 0.0,
                    s.bytes / band.max_bytes if band.max_bytes else 0.0,
                )
            )
        glob = None
        if spec.max_requests or spec.max_bytes:
            glob = (
                fc.count / spec.max_requests if spec.max_requests else 0.0,
                fc.bytes / spec.max_bytes if spec.max_bytes else 0.0,
            )
        snapshot = self._table.view()
        slots = snapshot.slots
        fresh = usable(
            snapshot.scraped_at[slots], snapshot.scrape_failures[slots], self._clock(), self._gauge.freshness
        )
        stale = int(slots.size - int(fresh.sum()))
        r = self.reclaimer
        eviction = None
        if r is not None:
            eviction = EvictionState(dict(r.issued), r.confirmed, r.timed_out, r.reclaim_target, r.pending_reclaim)
        return QueueState(flows, self.saturation, stale, bands, glob, eviction)

    def report(self, now: float) -> dict[str, Any]:
        """For /debug/pool: bands (highest first) with queue lengths, bytes, flows and the oldest wait."""
        return {
            "saturation": self.saturation,
            "queued": self.controller.count,
            "queuedBytes": self.controller.bytes,
            "staleFallback": self._gauge.last_stale and self._gauge.fallback,
            "learnedConcurrency": self._gauge.learned_limit,
            "eviction": self._eviction_report(),
            "bands": [
                {
                    "priority": s.priority,
                    "requests": s.requests,
                    "bytes": s.bytes,
                    "oldestWaitSeconds": None if s.oldest_enqueued_at is None else now - s.oldest_enqueued_at,
                    "flows": {fid: {"requests": r, "bytes": b} for fid, (r, b) in s.flows.items()},
                }
                for s in self.controller.stats()
            ],
        }

    def _eviction_report(self) -> dict[str, Any] | None:
        r = self.reclaimer
        if r is None:
            return None
        return {
            "evictable": r.evictable_count,
            "issued": sum(r.issued.values()),
            "confirmed": r.confirmed,
            "timedOut": r.timed_out,
            "pendingReclaim": r.pending_reclaim,
            "graceSeconds": r.grace_s,
        }


def _resolve(item: QueuedRequest, outcome: Outcome) -> bool:
    """Wake the waiter with its outcome; False when it was gone (cancelled) already."""
    future = item.ticket
    if not isinstance(future, asyncio.Future) or future.done():
        return False
    future.set_result(outcome)
    return True
