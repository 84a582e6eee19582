"""The grpc.aio adapter: feeds each stream's messages to a StreamProcessor and writes back what it answers.

Everything protocol-shaped lives in `stream`; this file moves messages, owns what the streams share (the prebuilt
decision answers, the buffered-body budget), enforces the server's bounds (`bounds.ServerLimits`) and guarantees
the ending: whatever happens to the stream (client gone, Envoy reset, server stopping, idle too long) the
processor's `close()` runs, so the request's in-flight booking and its buffered bytes are released.

How a stream ends matters for memory. Envoy closes an ext_proc stream by half-closing and resetting it in the same
breath (END_STREAM then RST_STREAM), never waiting for our status. grpc.aio leaks the native op array of every
batch that fails or whose awaiting task is cancelled (80 B per op, plus the message of a failed send), and a final
status sent after that reset is such a batch: through Envoy, RSS grew ~140 B per request without end. So once a
stream is over from our side (Envoy half-closed, or we sent the last answer), the handler waits up to
`close_grace_s` on a plain timer before returning: Envoy's reset lands during the wait, grpc cancels the task
there, no batch is left to fail, and nothing leaks. A client that half-closes and waits for the status (any
well-behaved gRPC client) gets it `close_grace_s` later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp import wire
from epp.director.flow import EVICTED, Waiter
from epp.errors import EppError, ErrorCode
from epp.extproc import messages as m
from epp.extproc.bounds import BodyBudget, ServerLimits
from epp.extproc.stream import Decider, StreamObserver, StreamProcessor, StreamSettings
from epp.flowcontrol.eviction import InFlight
from epp.observability.ratelimit import RateLimitedLog
from epp.requests import InferenceRequest

log = logging.getLogger(__name__)


class ServerObserver(StreamObserver, Protocol):
    """What the server reports about whole streams (upstream's extproc_streams_*); the metrics implement it."""

    def stream_started(self) -> None: ...

    def stream_finished(self, code: str, seconds: float) -> None: ...


class FlowControl(Protocol):
    """Flow control as the protocol sees it (`epp.director.flow.FlowGate`): `enter` admits, refuses (EppError) or
    queues the request; a queued one is waited on in slices (`wait`), and `abandon`ed if its stream goes away."""

    def enter(self, headers: Mapping[str, str], size: int) -> Waiter | None: ...

    async def wait(self, waiter: Waiter, timeout: float | None = None) -> bool: ...

    def abandon(self, waiter: Waiter) -> None: ...

    def decided(self) -> None: ...

    @property
    def evicting(self) -> bool: ...

    def track(self, headers: Mapping[str, str], evict: Callable[[], None]) -> InFlight | None: ...

    def untrack(self, item: InFlight) -> None: ...


class Tokenizer(Protocol):
    """The render client as the protocol sees it (`epp.director.tokens.RenderTokenizer`): never raises, bounded
    by its timeout."""

    async def tokenize(self, request: InferenceRequest) -> InferenceRequest: ...


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(
        self,
        decider: Decider,
        observer: ServerObserver,
        settings: StreamSettings,
        clock: Callable[[], float] = time.perf_counter,
        limits: ServerLimits | None = None,
    ) -> None:
        self._decider = decider
        self._observer = observer
        self._settings = settings
        self._clock = clock
        self._limits = limits = limits or ServerLimits()
        self.answers = m.DecisionAnswers()
        self.budget = BodyBudget(limits.max_buffered_bytes)
        self._warn = RateLimitedLog(log, every_s=10.0)
        self.open_streams = 0
        self._flow: FlowControl | None = getattr(decider, "flow", None)
        # A vllm token-producer's render client (epp.director.tokens): its call runs here, before the decision,
        # and leaves the token ids in its cache, where the director's synchronous decide finds them.
        self._tokenizer: Tokenizer | None = getattr(decider, "tokenizer", None)

    def new_stream(self) -> StreamProcessor:
        """A stream's state machine, sharing this server's answers, budget and rate-limited log."""
        return StreamProcessor(
            self._decider, self._observer, self._clock, self._settings, self.answers, self.budget, self._warn
        )

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.ProcessingResponse]:
        if self.open_streams >= self._limits.max_streams:
            yield self._over_cap()
            return
        stream = self.new_stream()
        self.open_streams += 1
        watchdog = _IdleWatchdog(self._limits.idle_timeout_s)
        messages = aiter(request_iterator)
        started = self._clock()
        self._observer.stream_started()
        code = "Unknown"  # an exception out of the stream (a broken stream), unless it ends or is cancelled
        evictor: _Evictor | None = None  # set while a sheddable request of ours is in flight, with eviction on
        try:
            while True:
                if evictor is not None:
                    if evictor.requested:  # evicted while this task was not waiting for a message
                        for response in self._evict(stream, evictor):
                            yield response
                        code = "OK"
                        await _linger(self._limits.close_grace_s)
                        return
                    evictor.armed = True
                try:
                    message = await anext(messages)
                except StopAsyncIteration:
                    code = "OK"
                    await _linger(self._limits.close_grace_s)
                    return
                except asyncio.CancelledError:
                    if evictor is not None and evictor.fired():
                        for response in self._evict(stream, evictor):
                            yield response
                        code = "OK"
                        await _linger(self._limits.close_grace_s)
                        return
                    if not watchdog.fired():
                        code = "Canceled"
                        raise
                    code = "DeadlineExceeded"
                    self._warn.log(
                        "idle",
                        logging.WARNING,
                        "ending an ext_proc stream idle for %gs (--stream-idle-timeout) in %s",
                        watchdog.idle_s,
                        stream.phase.name,
                    )
                    for response in stream.expire(watchdog.idle_s):
                        yield response
                    return
                if evictor is not None:
                    evictor.armed = False
                watchdog.touch()
                tokenizer = self._tokenizer
                if tokenizer is not None:
                    ahead = stream.request_for(message)
                    if ahead is not None:
                        watchdog.hold = True  # bounded by the render timeout
                        try:
                            await tokenizer.tokenize(ahead)
                        finally:
                            watchdog.hold = False
                            watchdog.touch()
                gate = self._flow
                pending = stream.decides_on(message) if gate is not None else None
                if pending is not None:
                    assert gate is not None
                    watchdog.hold = True  # waiting in the queue is not idleness
                    waiter: Waiter | None = None
                    try:
                        waiter = gate.enter(*pending)
                        if waiter is not None:
                            # Queued: Envoy's per-message timer runs meanwhile. Ask it to wait longer, again and
                            # again while we hold the request, so only our TTL (or the client) ends the wait.
                            yield m.hold_response(wire.QUEUE_HOLD_S)
                            while not await gate.wait(waiter, wire.QUEUE_HOLD_S / 2):
                                yield m.hold_response(wire.QUEUE_HOLD_S)
                    except EppError as err:
                        for response in stream.refuse(err):
                            yield response
                        code = "OK"
                        return
                    finally:
                        if waiter is not None:
                            gate.abandon(waiter)  # the stream went away while queued (no-op once decided)
                        watchdog.hold = False
                        watchdog.touch()
                    try:
                        responses = stream.handle(message)
                    finally:
                        gate.decided()
                    if gate.evicting and stream.in_flight:
                        evictor = _Evictor()
                        evictor.handle = gate.track(pending[0], evictor)
                        if evictor.handle is None:  # not sheddable: never evicted
                            evictor = None
                    for response in responses:
                        yield response
                else:
                    for response in stream.handle(message):
                        yield response
                if evictor is not None and not stream.in_flight:  # its response ended: nothing left to evict
                    assert evictor.handle is not None and self._flow is not None
                    self._flow.untrack(evictor.handle)
                    evictor = None
                if stream.finished:
                    code = "OK"
                    await _linger(self._limits.close_grace_s)
                    return
        finally:
            watchdog.stop()
            stream.close()
            if evictor is not None and evictor.handle is not None and self._flow is not None:
                self._flow.untrack(evictor.handle)  # the stream ended: an evicted one confirms its revocation
            self.open_streams -= 1
            self._observer.stream_finished(code, self._clock() - started)

    def _evict(self, stream: StreamProcessor, evictor: _Evictor) -> list[pb.ProcessingResponse]:
        """Flow control ends this in-flight request for a higher-priority one: 429 `evicted` (Envoy then resets
        the model server's connection), its booking released now, the revocation confirmed."""
        responses = stream.refuse(EVICTED)
        if evictor.handle is not None and self._flow is not None:
            self._flow.untrack(evictor.handle)
        return responses

    def _over_cap(self) -> pb.ProcessingResponse:
        """The answer to a stream above `--max-concurrent-streams`: 503 at once, before anything is read."""
        self._observer.stream_refused("stream_cap")
        self._warn.log(
            "stream-cap",
            logging.WARNING,
            "refusing an ext_proc stream: %d are open (--max-concurrent-streams %d)",
            self.open_streams,
            self._limits.max_streams,
        )
        err = EppError(ErrorCode.SERVICE_UNAVAILABLE, "the endpoint picker has too many open streams; retry later")
        self._observer.request_done(err.code, "", "")
        return m.immediate_response(err)


async def _linger(grace_s: float) -> None:
    """Wait for the peer's reset before the final status goes out (see the module docstring). A reset cancels
    this sleep and the task ends without a status batch; a peer that waits for the status gets it after."""
    if grace_s > 0:
        await asyncio.sleep(grace_s)


def add_to_server(processor: ExternalProcessor, server: grpc.aio.Server) -> None:
    pb_grpc.add_ExternalProcessorServicer_to_server(processor, server)


class _Evictor:
    """How the dispatch task ends one stream's in-flight request early: called, it cancels the stream's task if
    that task is waiting for Envoy's next message (else the stream notices before its next wait); `fired()` tells
    this cancel from a real one and takes it back from the task, as `_IdleWatchdog` does."""

    __slots__ = ("_fired", "_task", "armed", "handle", "requested")

    def __init__(self) -> None:
        self._task = asyncio.current_task()
        self.handle: InFlight | None = None
        self.armed = False  # the stream's task is awaiting the next message
        self.requested = False
        self._fired = False

    def __call__(self) -> None:
        self.requested = True
        if self.armed and self._task is not None and not self._fired:
            self._fired = True
            self._task.cancel()

    def fired(self) -> bool:
        if not self._fired:
            return False
        self._fired = False
        if self._task is not None:
            self._task.uncancel()
        return True


class _IdleWatchdog:
    """Cancels the stream's task when no message came for `idle_s`.

    One timer per stream, re-armed only when it fires: a message costs a clock read, where a timeout context
    around each read cost ~5–12 µs per message. The cancel lands in the pending read (or, if the task is stuck
    writing to a peer that stopped reading, in the write, which ends the stream); `fired()` tells our own cancel
    from a real one and takes it back from the task, so later awaits are not cancelled again.
    """

    __slots__ = ("_expired", "_handle", "_loop", "_task", "hold", "idle_s", "last")

    def __init__(self, idle_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self.idle_s = idle_s
        self.last = self._loop.time()
        self._expired = False
        self.hold = False  # the stream waits in the flow-control queue: not idle
        self._handle: asyncio.TimerHandle | None = self._loop.call_at(self.last + idle_s, self._check)

    def touch(self) -> None:
        self.last = self._loop.time()

    def _check(self) -> None:
        if self.hold:
            self.last = self._loop.time()
        due = self.last + self.idle_s
        if self._loop.time() < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self._handle = None
        self._expired = True
        if self._task is not None:
            self._task.cancel()

    def fired(self) -> bool:
        if not self._expired:
            return False
        if self._task is not None:
            self._task.uncancel()
        return True

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
