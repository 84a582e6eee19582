"""Flow control in a serving worker: the picker has one set of queues, in the control process, and a worker's
requests wait in them through messages on the kit's pipe.

A band's capacity, fairness and TTLs are the picker's, and the dispatch rule reads the saturation of the whole
pool with every worker's picks in flight; so the decision is made once, by the control process's `FlowGate`
(`epp.app.flow_host`), with the same code one process runs. A worker's `RemoteFlowGate` is what its decision
pipeline holds on (`FlowHold`):

- `Enqueue` (worker → control): a request arrives (id, priority, fairness id, size, arrival, TTFT SLO); the
  control answers `Verdict` with the outcome: dispatched at once or after a wait, or refused (capacity, TTL,
  admission, shutting down) with upstream's status and reason. The stream holds meanwhile (the hold responses);
- `Decided`: a dispatched request was decided and its pick booked in the in-flight matrix, so the control's next
  cycle reads a saturation that counts it; `Abandon`: the stream went away before its verdict was read;
- with `enableEviction`: `Track` / `Untrack` a sheddable request in flight; `Evict` (control → worker) ends one.

If the control process goes away, every request still waiting gets 503 `rejected-shutting-down`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from epp import wire
from epp.datastore.objectives import ObjectiveStore
from epp.director.flow import outcome_error, queued_item
from epp.flowcontrol import Outcome
from epp.flowcontrol.eviction import evictable
from epp.requests.openai import control_headers

# A verdict that comes within this needs no hold response: the common case, a request let through at once, costs
# the stream one round trip on the pipe and nothing on the wire.
FIRST_HOLD_S = 0.05


@dataclass(frozen=True, slots=True)
class Enqueue:
    id: int
    priority: int
    flow_id: str
    size: int
    received_at: float
    slo_ttft_s: float | None


@dataclass(frozen=True, slots=True)
class Verdict:
    id: int
    outcome: str  # an `Outcome` value


@dataclass(frozen=True, slots=True)
class Decided:
    id: int


@dataclass(frozen=True, slots=True)
class Abandon:
    id: int


@dataclass(frozen=True, slots=True)
class Track:
    id: int
    priority: int


@dataclass(frozen=True, slots=True)
class Untrack:
    id: int


@dataclass(frozen=True, slots=True)
class Evict:
    id: int


CONTROL_MESSAGES = (Verdict, Evict)


class RemoteFlowGate:
    """A serving worker's side of the control process's flow control (see the module's docstring)."""

    def __init__(
        self,
        send: Callable[[Any], None],
        clock: Callable[[], float],
        objectives: ObjectiveStore | None,
        evicting: bool,
    ) -> None:
        self._send = send
        self._clock = clock
        self._objectives = objectives
        self._evicting = evicting
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Outcome]] = {}
        self._undecided: list[int] = []  # dispatched, not yet decided
        self._evicts: dict[int, Callable[[], None]] = {}
        self._closed = False

    async def hold(self, headers: Mapping[str, str], size: int) -> AsyncGenerator[float, None]:
        """As `FlowGate.hold`: ends when the request may be scheduled (then call `decided`), raises EppError when
        it is refused, yields the seconds Envoy should keep waiting while it is queued."""
        if self._closed:
            raise outcome_error(Outcome.REJECTED_SHUTDOWN)
        item = queued_item(headers, size, self._clock(), self._objectives)
        rid = next(self._ids)
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        settled = False
        try:
            try:
                self._send(Enqueue(rid, item.priority, item.flow_id, item.size, item.received_at, item.slo_ttft_s))
            except OSError:  # the control process is gone
                self.close()
                raise outcome_error(Outcome.REJECTED_SHUTDOWN) from None
            timeout = FIRST_HOLD_S
            while not (await asyncio.wait((future,), timeout=timeout))[0]:
                yield wire.QUEUE_HOLD_S
                timeout = wire.QUEUE_HOLD_S / 2
            settled = True
            outcome = future.result()
            if outcome is not Outcome.DISPATCHED:
                raise outcome_error(outcome)
            self._undecided.append(rid)
        finally:
            self._pending.pop(rid, None)
            if not settled and not self._closed:
                self._send_quietly(Abandon(rid))  # queued or just dispatched: the control frees its place

    def decided(self) -> None:
        if self._undecided:
            self._send_quietly(Decided(self._undecided.pop()))

    def wake(self) -> None:
        """A release: the control process reads it in the in-flight matrix (`epp.app.flow_host`)."""

    @property
    def evicting(self) -> bool:
        return self._evicting

    def track(self, headers: Mapping[str, str], evict: Callable[[], None]) -> int | None:
        """A sheddable request in flight, with eviction on: its id (for `untrack`); None when it is not one."""
        if not self._evicting:
            return None
        priority = self._objectives.priority_of(control_headers(headers).objective) if self._objectives else 0
        if not evictable(priority):
            return None
        tid = next(self._ids)
        self._evicts[tid] = evict
        self._send_quietly(Track(tid, priority))
        return tid

    def untrack(self, item: Any) -> None:
        if self._evicts.pop(item, None) is not None:
            self._send_quietly(Untrack(item))

    # -- the pipe ----------------------------------------------------------------------------------------------
    def receive(self, msg: Verdict | Evict) -> None:
        """A message of the control process's flow control."""
        if isinstance(msg, Verdict):
            future = self._pending.get(msg.id)
            if future is not None and not future.done():
                future.set_result(Outcome(msg.outcome))
        else:
            evict = self._evicts.get(msg.id)
            if evict is not None:
                evict()

    def close(self) -> None:
        """The control process is gone: every waiting request is answered 503, and every later one."""
        self._closed = True
        for future in self._pending.values():
            if not future.done():
                future.set_result(Outcome.REJECTED_SHUTDOWN)

    def _send_quietly(self, msg: Any) -> None:
        try:
            self._send(msg)
        except OSError:  # the pipe is gone: `close` follows, from the worker's reader
            pass
