"""The grpc.aio adapter: feeds each stream's messages to a StreamProcessor and writes back what it answers.

Everything protocol-shaped lives in `stream`; this file moves messages, owns what the streams share (the prebuilt
decision answers) and guarantees the ending: whatever happens to the stream (client gone, Envoy reset, server
stopping) the processor's `close()` runs, so the request's in-flight booking is released.
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

from epp.extproc import messages as m
from epp.extproc.stream import Decider, StreamObserver, StreamProcessor, StreamSettings

# What the server reports about whole streams (upstream's extproc_streams_*); the metrics implement both.


class ServerObserver(StreamObserver, Protocol):
    def stream_started(self) -> None: ...

    def stream_finished(self, code: str, seconds: float) -> None: ...


log = logging.getLogger(__name__)


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(
        self,
        decider: Decider,
        observer: ServerObserver,
        settings: StreamSettings,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._decider = decider
        self._observer = observer
        self._settings = settings
        self._clock = clock
        self.answers = m.DecisionAnswers()
        self.open_streams = 0

    def new_stream(self) -> StreamProcessor:
        """A stream's state machine, sharing this server's prebuilt answers."""
        return StreamProcessor(self._decider, self._observer, self._clock, self._settings, self.answers)

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.ProcessingResponse]:
        stream = self.new_stream()
        self.open_streams += 1
        started = self._clock()
        self._observer.stream_started()
        code = "Unknown"  # an exception out of the iterator (a broken stream) unless it ends or is cancelled
        try:
            async for message in request_iterator:
                for response in stream.handle(message):
                    yield response
                if stream.finished:
                    break
            code = "OK"
        except asyncio.CancelledError:
            code = "Canceled"
            raise
        finally:
            stream.close()
            self.open_streams -= 1
            self._observer.stream_finished(code, self._clock() - started)


def add_to_server(processor: ExternalProcessor, server: grpc.aio.Server) -> None:
    pb_grpc.add_ExternalProcessorServicer_to_server(processor, server)
