"""The grpc.aio adapter: feeds each stream's messages to a StreamProcessor and writes back what it answers.

Everything protocol-shaped lives in `stream`; this file moves messages, owns what the streams share (the prebuilt
decision answers) and guarantees the ending: whatever happens to the stream (client gone, Envoy reset, server
stopping) the processor's `close()` runs, so the request's in-flight booking is released.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.extproc import messages as m
from epp.extproc.stream import Decider, StreamObserver, StreamProcessor, StreamSettings

log = logging.getLogger(__name__)


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(
        self,
        decider: Decider,
        observer: StreamObserver,
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
        try:
            async for message in request_iterator:
                for response in stream.handle(message):
                    yield response
                if stream.finished:
                    return
        finally:
            stream.close()
            self.open_streams -= 1


def add_to_server(processor: ExternalProcessor, server: grpc.aio.Server) -> None:
    pb_grpc.add_ExternalProcessorServicer_to_server(processor, server)
