"""The control process's side of flow control with serving workers: the picker's one `FlowGate` answers the
workers' requests (the messages of `epp.director.flow_link`).

The queues, the dispatch task, admission and eviction are the gate's, as with one process: an `Enqueue` becomes
the gate's `arrive`, a waiter's outcome goes back as a `Verdict`, a `Decided` is the gate's `decided` (after the
workers' bookings are read into the control's table, so the next cycle counts the pick), an `Abandon` the gate's
`abandon`. With `enableEviction` a `Track` is the gate's `track_at`, and the eviction it decides is an `Evict` to
the worker that holds the request.

A worker that dies leaves nothing behind: its waiters leave the queue, its grants count as decided, its tracked
requests as ended (its picks in flight are cleared from the in-flight matrix by `epp.app.workers`). While any
request waits, the host reads the workers' bookings every 5 ms, so a release anywhere wakes the dispatch task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from epp.director.flow import FlowGate, Waiter
from epp.director.flow_link import Abandon, Decided, Enqueue, Evict, Track, Untrack, Verdict
from epp.flowcontrol import Outcome, QueuedRequest
from epp.flowcontrol.eviction import InFlight

log = logging.getLogger(__name__)

Key = tuple[int, int]  # (worker, the worker's request id)

# While requests wait, the workers' bookings are read this often, so a release on any worker wakes the dispatch
# task within it (the publication pass of `epp.app.workers` reads them only every 50 ms, to idle at ~0 CPU).
RELEASE_POLL_S = 0.005


class FlowHost:
    def __init__(
        self,
        gate: FlowGate,
        send: Callable[[int, Any], bool],
        sync_bookings: Callable[[], None],
        clock: Callable[[], float],
    ) -> None:
        """`send(worker, msg)` reaches a worker; `sync_bookings` reads every worker's picks in flight into the
        table the gate's saturation reads."""
        self._gate = gate
        self._send = send
        self._sync = sync_bookings
        self._clock = clock
        self._waiting: dict[Key, Waiter] = {}
        self._granted: set[Key] = set()
        self._tracked: dict[Key, InFlight] = {}
        self._poll: asyncio.Task[None] | None = None

    def receive(self, worker: int, msg: Any) -> None:
        """A flow-control message from `worker`."""
        key = (worker, msg.id)
        if isinstance(msg, Enqueue):
            self._enqueue(key, msg)
        elif isinstance(msg, Decided):
            if key in self._granted:
                self._granted.discard(key)
                self._sync()
                self._gate.decided()
        elif isinstance(msg, Abandon):
            self._abandon(key)
        elif isinstance(msg, Track):
            handle = self._gate.track_at(msg.priority, lambda: self._evict(key))
            if handle is not None:
                self._tracked[key] = handle
        elif isinstance(msg, Untrack):
            handle = self._tracked.pop(key, None)
            if handle is not None:
                self._gate.untrack(handle)

    def _enqueue(self, key: Key, msg: Enqueue) -> None:
        item = QueuedRequest(None, msg.flow_id, msg.priority, msg.size, msg.received_at, msg.slo_ttft_s)
        self._sync()  # the pool's load as the workers' bookings say it now, not as the last publication pass read it
        arrived = self._gate.arrive(item, self._clock())
        if arrived is None:
            self._granted.add(key)
            self._answer(key, Outcome.DISPATCHED)
        elif isinstance(arrived, Outcome):
            self._answer(key, arrived)
        else:
            self._waiting[key] = arrived
            arrived.future.add_done_callback(lambda _: self._settled(key, arrived))
            if self._poll is None or self._poll.done():
                self._poll = asyncio.get_running_loop().create_task(self._poll_releases(), name="flow releases")

    async def _poll_releases(self) -> None:
        """While anything waits: the workers' bookings, read every `RELEASE_POLL_S` (a fall wakes the gate)."""
        while self._waiting:
            await asyncio.sleep(RELEASE_POLL_S)
            self._sync()

    def _settled(self, key: Key, waiter: Waiter) -> None:
        if self._waiting.pop(key, None) is None or waiter.future.cancelled():
            return  # abandoned meanwhile
        outcome = self._gate.settle(waiter)
        if outcome is Outcome.DISPATCHED:
            self._granted.add(key)
        self._answer(key, outcome)

    def _evict(self, key: Key) -> None:
        self._send(key[0], Evict(key[1]))  # the worker answers the stream 429 `evicted`, then sends Untrack

    def _abandon(self, key: Key) -> None:
        waiter = self._waiting.pop(key, None)
        if waiter is not None:
            self._gate.abandon(waiter)  # its place freed (or, dispatched a moment ago, its grant)
        elif key in self._granted:
            self._granted.discard(key)
            self._gate.decided()

    def _answer(self, key: Key, outcome: Outcome) -> None:
        if not self._send(key[0], Verdict(key[1], outcome.value)) and outcome is Outcome.DISPATCHED:
            self._abandon(key)  # the worker is gone: its grant is nobody's

    def worker_gone(self, worker: int) -> None:
        """`worker` ended (it died, or stopped): what it held in flow control is let go."""
        for key in [k for k in self._waiting if k[0] == worker]:
            self._abandon(key)
        for key in [k for k in self._granted if k[0] == worker]:
            self._abandon(key)
        for key in [k for k in self._tracked if k[0] == worker]:
            self._gate.untrack(self._tracked.pop(key))

    @property
    def pending(self) -> int:
        """Requests the workers have in the queue or dispatched and not yet decided (tests, /debug/pool)."""
        return len(self._waiting) + len(self._granted)
