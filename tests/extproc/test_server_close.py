"""How a stream ends: Envoy half-closes and resets each ext_proc stream at once, and a final status sent after that
reset is a failed batch whose native memory grpc.aio never frees (~140 B per request through Envoy, without end).
The handler therefore waits `close_grace_s` before its status: the reset cancels the wait and no status is sent;
a client that half-closes and waits still gets its OK.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from prometheus_client import CollectorRegistry

from epp.extproc.bounds import ServerLimits
from epp.extproc.server import ExternalProcessor, add_to_server
from epp.extproc.stream import StreamSettings
from epp.observability.metrics import PickerMetrics
from tests.extproc.envoy import BODY, body_msg, headers_msg, inflight, make_director


def _processor(grace_s: float) -> tuple[ExternalProcessor, PickerMetrics]:
    metrics = PickerMetrics(CollectorRegistry())
    limits = ServerLimits(close_grace_s=grace_s)
    director = make_director()
    processor = ExternalProcessor(director, metrics, StreamSettings(), limits=limits)
    processor.director = director  # type: ignore[attr-defined]  # for the bookings the test reads
    return processor, metrics


async def test_a_stream_reset_after_its_half_close_ends_without_a_status_and_counts_ok() -> None:
    processor, _ = _processor(grace_s=60.0)
    exhausted = asyncio.Event()

    async def envoy_messages() -> AsyncIterator[pb.ProcessingRequest]:
        yield headers_msg()
        yield body_msg(BODY, end_of_stream=True)
        exhausted.set()  # END_STREAM: Envoy's reset follows in the same write

    answers: list[pb.ProcessingResponse] = []

    async def handler() -> None:
        async for answer in processor.Process(envoy_messages(), cast(Any, None)):
            answers.append(answer)

    task = asyncio.create_task(handler())
    await asyncio.wait_for(exhausted.wait(), 30)
    await asyncio.sleep(0)
    assert not task.done()  # waiting for the reset, not sending a status into it
    task.cancel()  # what grpc.aio does when the RST_STREAM arrives
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(answers) == 2  # the decision (headers) and the body, before the wait
    assert processor.open_streams == 0
    assert inflight(processor.director) == 0  # type: ignore[arg-type]


async def test_a_client_that_half_closes_and_waits_gets_its_ok_status() -> None:
    processor, _ = _processor(grace_s=0.01)
    server = grpc.aio.server()
    add_to_server(processor, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            messages = (headers_msg(), body_msg(BODY, end_of_stream=True))
            call = pb_grpc.ExternalProcessorStub(channel).Process(iter(messages))
            answers = [answer async for answer in call]
            assert len(answers) == 2
            assert await call.code() == grpc.StatusCode.OK
    finally:
        await server.stop(0)
    assert processor.open_streams == 0
