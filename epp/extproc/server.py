"""The grpc.aio adapter: feeds each stream's messages to a StreamProcessor and writes back what it answers.

Everything protocol-shaped lives in `stream`; this file moves messages, runs the director's pipeline when the stream
asks for its decision (`NeedDecision`: tokenize → flow-control hold → decide, `epp.director.pipeline`), owns what
the streams share (the prebuilt decision answers, the buffered-body budget), enforces the server's bounds
(`bounds.ServerLimits`) and guarantees the ending: whatever happens to the stream (client gone, Envoy reset, server
stopping, idle too long, evicted by flow control) the processor's `close()` runs, so the request's in-flight booking
and its buffered bytes are released.

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
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.director.decision import Decided, NeedDecision, Outcome
from epp.director.flow import EVICTED
from epp.director.pipeline import DecisionPipeline
from epp.errors import EppError, ErrorCode
from epp.extproc import messages as m
from epp.extproc.bounds import BodyBudget, ServerLimits
from epp.extproc.observer import StreamObserver
from epp.extproc.stream import StreamProcessor, StreamSettings
from epp.observability.ratelimit import RateLimitedLog

log = logging.getLogger(__name__)


class ServerObserver(StreamObserver[Any], Protocol):
    """What the server reports about whole streams (upstream's extproc_streams_*); the metrics implement it."""

    def stream_started(self) -> None: ...

    def stream_finished(self, code: str, seconds: float) -> None: ...


class Decider(Protocol):
    """The director as the adapter sees it: the pipeline every stream's decision goes through."""

    @property
    def pipeline(self) -> DecisionPipeline: ...


class PoolRoutes(Protocol):
    """A picker of several pools: the pipeline (and observer) of the pool a stream's gRPC metadata names
    (epp.director.pools.PoolRouter)."""

    def route(self, metadata: Any) -> tuple[DecisionPipeline, Any]: ...


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(
        self,
        decider: Decider,
        observer: ServerObserver,
        settings: StreamSettings,
        clock: Callable[[], float] = time.perf_counter,
        limits: ServerLimits | None = None,
        pools: PoolRoutes | None = None,
    ) -> None:
        """`pools`: with several pools, each stream's pipeline is its pool's (read from the stream's metadata);
        None: every stream uses `decider`'s."""
        self.pipeline = decider.pipeline
        self._pools = pools
        self._observer = observer
        self._settings = settings
        self._clock = clock
        self._limits = limits = limits or ServerLimits()
        self.answers = m.DecisionAnswers()
        self.budget = BodyBudget(limits.max_buffered_bytes)
        self._warn = RateLimitedLog(log, every_s=10.0)
        self.open_streams = 0
        self._sweep: _IdleSweep | None = None  # the idle bound's one timer, for the loop the streams run on

    def new_stream(self, pipeline: DecisionPipeline | None = None, observer: Any = None) -> StreamProcessor:
        """A stream's state machine, sharing this server's answers, budget and rate-limited log; its bookings are
        released through the pipeline (`pipeline`, `observer`: its pool's, with several pools)."""
        return StreamProcessor(
            pipeline or self.pipeline,
            observer or self._observer,
            self._clock,
            self._settings,
            self.answers,
            self.budget,
            self._warn,
        )

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext[Any, Any] | None = None,
        task: asyncio.Task[Any] | None = None,
    ) -> AsyncIterator[pb.ProcessingResponse]:
        """Each message to the stream, each answer back; a message that completes the request goes through the
        director's pipeline (holding Envoy with hold messages while flow control queues it) before the stream
        answers it. The one definition of a stream's life for both transports: grpc.aio calls it with its context,
        the native front (`epp.extproc.native`) with one that carries the stream's metadata alone, and the
        stream's task (`task`: which the idle timer cancels; without it, asyncio's current one)."""
        if self.open_streams >= self._limits.max_streams:
            yield self._over_cap()
            return
        if self._pools is None:
            pipeline = self.pipeline
            stream = self.new_stream()
        else:  # the pool the gateway's route named on this stream
            pipeline, observer = self._pools.route(context.invocation_metadata() if context is not None else None)
            stream = self.new_stream(pipeline, observer)
        self.open_streams += 1
        watch = _StreamWatch(task)
        sweep = self._sweep
        if sweep is None or sweep.loop is not watch.loop:  # the first stream (or a new loop: a test's own)
            self._sweep = sweep = _IdleSweep(watch.loop, self._limits.idle_timeout_s)
        sweep.add(watch)
        messages = aiter(request_iterator)
        decide = pipeline.immediate
        started = self._clock()
        self._observer.stream_started()
        code = "Unknown"  # an exception out of the stream (a broken stream), unless it ends or is cancelled
        try:
            while True:
                if watch.evicted and stream.in_flight:  # evicted while this task was not waiting for a message
                    for response in stream.refuse(EVICTED):
                        yield response
                    code = "OK"
                    await _linger(self._limits.close_grace_s)
                    return
                watch.reading = True
                try:
                    message = await anext(messages)
                except StopAsyncIteration:
                    code = "OK"
                    await _linger(self._limits.close_grace_s)
                    return
                except asyncio.CancelledError:
                    cause = watch.fired()
                    if cause is None:
                        code = "Canceled"
                        raise
                    if cause is _EVICT:
                        for response in stream.refuse(EVICTED):
                            yield response
                        code = "OK"
                        await _linger(self._limits.close_grace_s)
                        return
                    code = "DeadlineExceeded"
                    self._warn.log(
                        "idle",
                        logging.WARNING,
                        "ending an ext_proc stream idle for %gs (--stream-idle-timeout) in %s",
                        watch.idle_s,
                        stream.phase.name,
                    )
                    for response in stream.expire(watch.idle_s):
                        yield response
                    return
                watch.reading = False
                watch.touch()
                answers = stream.handle(message)
                if answers.__class__ is NeedDecision:  # the request, parsed: its decision first
                    waited = 0.0
                    if decide is not None:  # no stage waits (the default): the director decides at once
                        try:
                            outcome: Outcome | None = decide(answers, stream.subset)
                        except Exception as exc:  # a refusal (EppError) or a failure: the stream answers it
                            outcome = exc
                    else:  # a stage waits: a render call, the flow-control queue
                        outcome = None
                        watch.hold = True  # not idleness
                        async for step in pipeline.run(answers, stream.subset, watch.evict):
                            if step.__class__ is Decided:
                                outcome, waited = step
                            else:  # queued: Envoy's per-message timer runs meanwhile
                                yield m.hold_response(step)  # type: ignore[arg-type]
                        watch.hold = False
                        watch.touch()
                    answers = stream.resume(outcome, waited)
                for response in answers:
                    yield response
                if stream.finished:
                    code = "OK"
                    await _linger(self._limits.close_grace_s)
                    return
        finally:
            sweep.discard(watch)
            stream.close()  # the booking released (and an evicted request's revocation confirmed) once
            self.open_streams -= 1
            self._observer.stream_finished(code, self._clock() - started)

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
    """`pb_grpc.add_ExternalProcessorServicer_to_server`'s registration, with a serializer that also takes an
    answer held as its bytes (`messages.EncodedAnswer`): the generated one accepts messages only."""
    handlers = {
        "Process": grpc.stream_stream_rpc_method_handler(
            processor.Process,
            request_deserializer=m.ProcessingRequest.FromString,
            response_serializer=m.serialize,
        )
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
    server.add_registered_method_handlers(_SERVICE, handlers)  # type: ignore[attr-defined]  # grpcio's stubs lag


_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"


_IDLE = "idle"
_EVICT = "evicted"


class _StreamWatch:
    """Why the stream's task may be cancelled while it waits: no message came for the idle bound (`_IdleSweep`), or
    flow control evicts its request in flight (`evict`, called by the dispatch task). `fired()` tells these cancels
    from a real one, says which it was and takes it back from the task, so later awaits are not cancelled again.

    A message costs a clock read (`touch`), where a timeout context around each read cost ~5–12 µs per message. The
    idle cancel lands in the pending read (or, if the task is stuck writing to a peer that stopped reading, in the
    write, which ends the stream). An eviction cancels only a pending read (`reading`); otherwise the stream notices
    `evicted` before its next read.
    """

    __slots__ = ("_cause", "_task", "evicted", "hold", "idle_s", "last", "loop", "reading")

    def __init__(self, task: asyncio.Task[Any] | None = None) -> None:
        # The stream's task as its transport knows it (the native front's context carries it), else asyncio's
        # current one (grpc.aio): on CPython 3.11 `current_task()` and `get_running_loop()` are a getpid system
        # call each (their fork check), where `get_loop()` reads an attribute.
        self._task = task if task is not None else asyncio.current_task()
        self.loop = self._task.get_loop() if self._task is not None else asyncio.get_running_loop()
        self.idle_s = 0.0  # the bound, set by the sweep that watches it
        self.last = self.loop.time()
        self._cause: str | None = None
        self.hold = False  # the request is being decided (render call, flow-control queue): not idle
        self.reading = False  # the task awaits Envoy's next message
        self.evicted = False

    def touch(self) -> None:
        self.last = self.loop.time()

    def evict(self) -> None:
        self.evicted = True
        if self.reading:
            self._cancel(_EVICT)

    def expire(self) -> None:
        self._cancel(_IDLE)

    def _cancel(self, cause: str) -> None:
        if self._cause is None and self._task is not None:
            self._cause = cause
            self._task.cancel()

    def fired(self) -> str | None:
        cause = self._cause
        if cause is None:
            return None
        if self._task is not None:
            self._task.uncancel()
        if cause is _EVICT:
            self._cause = None  # the idle timer may still end the stream later
        return cause


class _IdleSweep:
    """The idle bound of every stream on one loop, kept by one timer: a stream's own timer, made and cancelled per
    stream, cost ~1.4 µs a request (uvloop's timer handle, its libuv timer started and stopped).

    The timer is armed at the earliest deadline any watched stream had when it was armed; a message only moves a
    stream's deadline later and a new stream's is `idle_s` from now, so it never fires after a stream's bound has
    passed: each stream still ends as soon as it has been idle `idle_s` (a stream being decided, `hold`, is not
    idle). When it fires, it ends the streams whose bound has passed and is armed again at the earliest deadline
    left; with short streams that is about `idle_s` later, one walk of the open streams each time, and once none is
    open it is not armed again."""

    __slots__ = ("_handle", "idle_s", "loop", "watches")

    def __init__(self, loop: asyncio.AbstractEventLoop, idle_s: float) -> None:
        self.loop = loop
        self.idle_s = idle_s
        self.watches: set[_StreamWatch] = set()
        self._handle: asyncio.TimerHandle | None = None

    def add(self, watch: _StreamWatch) -> None:
        watch.idle_s = self.idle_s
        self.watches.add(watch)
        if self._handle is None:
            self._handle = self.loop.call_at(watch.last + self.idle_s, self._sweep)

    def discard(self, watch: _StreamWatch) -> None:
        self.watches.discard(watch)

    def _sweep(self) -> None:
        self._handle = None
        now = self.loop.time()
        idle_s = self.idle_s
        due: float | None = None
        for watch in list(self.watches):
            if watch.hold:
                watch.last = now
            deadline = watch.last + idle_s
            if now >= deadline:
                self.watches.discard(watch)  # ended once: its stream answers the expiry and returns
                watch.expire()
            elif due is None or deadline < due:
                due = deadline
        if due is not None:
            self._handle = self.loop.call_at(due, self._sweep)
