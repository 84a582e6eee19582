"""The gRPC server's resource bounds, over a real grpc.aio server on loopback: stream cap, idle timeout, body budget.

Reproduction 4 of the hardening probe: with no cap, idle timeout or budget, 5,000 idle streams were held (27 KB
each) and 50 unfinished 8 MiB bodies added 915 MB.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from prometheus_client import CollectorRegistry

from epp import wire
from epp.datastore import EndpointInfo, EndpointTable
from epp.director import Director
from epp.errors import ConfigError
from epp.extproc.bounds import ServerLimits
from epp.extproc.server import ExternalProcessor, add_to_server
from epp.extproc.stream import StreamSettings
from epp.observability.metrics import PickerMetrics
from epp.scheduling import build_scheduler
from tests.extproc.envoy import BODY, POOL, body_msg, headers_msg, inflight, make_director


class _Server:
    def __init__(self, limits: ServerLimits, director: Director | None = None) -> None:
        self.director = director or make_director()
        self.metrics = PickerMetrics(CollectorRegistry())
        self.processor = ExternalProcessor(self.director, self.metrics, StreamSettings(), limits=limits)
        self.grpc = grpc.aio.server()
        add_to_server(self.processor, self.grpc)
        self.port = self.grpc.add_insecure_port("127.0.0.1:0")

    def refusals(self, reason: str) -> float:
        value = self.metrics.registry.get_sample_value("epp_stream_refusals_total", {"reason": reason})
        return value or 0.0


@pytest.fixture
async def make_server() -> AsyncIterator[object]:
    servers: list[_Server] = []

    async def start(limits: ServerLimits, director: Director | None = None) -> _Server:
        server = _Server(limits, director)
        await server.grpc.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.grpc.stop(0)


class _Client:
    """One ext_proc stream from the test, as Envoy would hold it: send when told, read what comes back."""

    def __init__(self, port: int) -> None:
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.outbox: asyncio.Queue[pb.ProcessingRequest | None] = asyncio.Queue()
        self.call = pb_grpc.ExternalProcessorStub(self.channel).Process(self._requests())

    async def _requests(self) -> AsyncIterator[pb.ProcessingRequest]:
        while (msg := await self.outbox.get()) is not None:
            yield msg

    async def send(self, msg: pb.ProcessingRequest) -> None:
        await self.outbox.put(msg)

    async def answer(self) -> pb.ProcessingResponse:
        response = await asyncio.wait_for(self.call.read(), 30)
        assert response is not grpc.aio.EOF
        assert isinstance(response, pb.ProcessingResponse)
        return response

    async def close(self) -> None:
        await self.outbox.put(None)
        await self.channel.close()


async def _until(condition: object, rounds: int = 3000) -> None:
    for _ in range(rounds):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_streams_above_the_cap_get_503_and_are_counted(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await make_server(ServerLimits(max_streams=2))
    held = [_Client(server.port) for _ in range(2)]
    for client in held:
        await client.send(headers_msg())  # FULL_DUPLEX: the stream stays open waiting for the body
    await _until(lambda: server.processor.open_streams == 2)
    extra = _Client(server.port)
    await extra.send(headers_msg())
    answer = await extra.answer()
    assert answer.immediate_response.status.code == 503
    assert "too many open streams" in answer.immediate_response.body.decode()
    assert server.refusals("stream_cap") == 1.0
    await held[0].send(body_msg(BODY, True))
    assert (await held[0].answer()).WhichOneof("response") == "request_headers"  # the held ones still work
    for client in (*held, extra):
        await client.close()
    await _until(lambda: server.processor.open_streams == 0)
    assert inflight(server.director) == 0


async def test_an_answer_held_as_its_bytes_is_written_by_grpc(make_server) -> None:  # type: ignore[no-untyped-def]
    """With scores and a receipt the decision's answer is built as wire bytes (`messages.EncodedAnswer`), which
    the generated servicer's serializer would refuse: `add_to_server`'s writes them."""
    table = EndpointTable()
    table.replace_all(EndpointInfo(address=a) for a in POOL)
    table.synced = True
    director = Director(table, build_scheduler(None, seed=1), clock=lambda: 0.0, emit_receipts=True)
    server = await make_server(ServerLimits(), director)
    client = _Client(server.port)
    await client.send(headers_msg())
    await client.send(body_msg(BODY, True))
    lb = (await client.answer()).dynamic_metadata.fields[wire.LB_NAMESPACE].struct_value.fields
    assert lb[wire.DESTINATION_HEADER].string_value in POOL
    assert set(lb[wire.DESTINATION_SCORES_KEY].struct_value.fields) == set(POOL)
    assert '"chosen":"' + lb[wire.DESTINATION_HEADER].string_value in lb[wire.ROUTE_RECEIPT_KEY].string_value
    await client.close()


async def test_a_stream_idle_before_its_request_is_complete_gets_503(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await make_server(ServerLimits(idle_timeout_s=0.2))
    client = _Client(server.port)
    await client.send(headers_msg())
    await client.send(body_msg(BODY[:10], False))
    answer = await client.answer()
    assert answer.immediate_response.status.code == 503
    assert "no ext_proc message for 0.2s" in answer.immediate_response.body.decode()
    assert server.refusals("idle_timeout") == 1.0
    await _until(lambda: server.processor.open_streams == 0)
    assert server.processor.budget.used == 0
    await client.close()


async def test_a_decided_stream_that_goes_idle_is_ended_and_its_booking_released(make_server) -> None:  # type: ignore[no-untyped-def]
    server = await make_server(ServerLimits(idle_timeout_s=0.2))
    client = _Client(server.port)
    await client.send(headers_msg())
    await client.send(body_msg(BODY, True))
    assert (await client.answer()).WhichOneof("response") == "request_headers"
    await _until(lambda: server.processor.open_streams == 0)
    assert inflight(server.director) == 0
    assert server.refusals("idle_timeout") == 1.0
    await client.close()


async def test_bodies_over_the_buffered_budget_get_429_and_the_budget_returns(make_server) -> None:  # type: ignore[no-untyped-def]
    limits = ServerLimits(max_buffered_bytes=len(BODY) * 2)
    server = await make_server(limits)
    first, second = _Client(server.port), _Client(server.port)
    for client in (first, second):
        await client.send(headers_msg())
    await first.send(body_msg(BODY + BODY[:-1], False))  # holds all but one byte of the budget
    await _until(lambda: server.processor.budget.used == len(BODY) * 2 - 1)
    await second.send(body_msg(BODY[:2], False))
    answer = await second.answer()
    assert answer.immediate_response.status.code == 429
    assert server.refusals("body_budget") == 1.0
    await first.close()
    await _until(lambda: server.processor.open_streams == 0)
    assert server.processor.budget.used == 0
    await second.close()


def test_limits_refuse_a_budget_below_one_accepted_body() -> None:
    with pytest.raises(ConfigError, match="--max-buffered-body-bytes"):
        ServerLimits(max_buffered_bytes=1000).check(max_body_bytes=2000)
