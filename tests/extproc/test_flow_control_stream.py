"""Flow control over a real grpc.aio server on loopback: the ext_proc stream of a queued request stays open (no
answer, not idle-timed-out), is answered with the decision once the pool has room, or with an ImmediateResponse
carrying `x-llm-d-request-dropped-reason`; a client that goes away frees its place at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from prometheus_client import CollectorRegistry

from epp import wire
from epp.config.flowcontrol import FlowControlSpec
from epp.datastore import EndpointInfo, EndpointTable, Freshness
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.table import MetricsSample
from epp.director import Director
from epp.director.flow import FlowGate
from epp.extproc.bounds import ServerLimits
from epp.extproc.server import ExternalProcessor, add_to_server
from epp.extproc.stream import StreamSettings
from epp.flowcontrol import FlowController, FlowSettings
from epp.flowcontrol.eviction import Reclaimer, confirmation_grace
from epp.flowcontrol.gauge import PoolGauge
from epp.observability.flow import FlowControlMetrics
from epp.observability.metrics import PickerMetrics
from epp.scheduling import Scheduler
from epp.scheduling.saturation import ConcurrencyDetector, SaturationDetector
from tests.extproc.envoy import BODY, body_msg, headers_msg, response_headers
from tests.support.schedulers import RandomScheduler

ADDRESS = "127.10.0.1:8000"


class _Stack:
    def __init__(self, ttl_s: float) -> None:
        self.now = 100.0
        self.table = EndpointTable()
        self.slot = self.table.upsert(EndpointInfo(address=ADDRESS))
        self.saturate()
        detector = SaturationDetector(freshness=Freshness(staleness_s=1e6))
        settings = FlowSettings(spec=FlowControlSpec(default_request_ttl_s=ttl_s))
        self.gate = FlowGate(FlowController(settings), self.table, PoolGauge(detector, detector.freshness), self.clock)
        director = Director(self.table, Scheduler(RandomScheduler(seed=1)), clock=self.clock, flow=self.gate)
        limits = ServerLimits(idle_timeout_s=0.2)  # shorter than the waits below: waiting is not idleness
        self.processor = ExternalProcessor(
            director, PickerMetrics(CollectorRegistry()), StreamSettings(), limits=limits
        )
        self.grpc = grpc.aio.server()
        add_to_server(self.processor, self.grpc)
        self.port = self.grpc.add_insecure_port("127.0.0.1:0")

    def clock(self) -> float:
        return self.now

    def saturate(self) -> None:
        self.table.record_scrape(self.slot, MetricsSample(waiting=10, kv_usage=0.0), now=self.now)

    def drain(self) -> None:
        self.table.record_scrape(self.slot, MetricsSample(waiting=0, kv_usage=0.0), now=self.now)


@pytest.fixture
async def stack() -> AsyncIterator[_Stack]:
    s = _Stack(ttl_s=60.0)
    s.gate.start()
    await s.grpc.start()
    yield s
    await s.gate.shutdown(0)
    await s.grpc.stop(0)


async def _open(port: int) -> tuple[grpc.aio.Channel, grpc.aio.StreamStreamCall]:  # type: ignore[type-arg]
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = pb_grpc.ExternalProcessorStub(channel).Process()
    await call.write(headers_msg())
    await call.write(body_msg(BODY, end_of_stream=True))
    return channel, call


async def _answer(call: grpc.aio.StreamStreamCall, holds: list[float] | None = None) -> pb.ProcessingResponse:  # type: ignore[type-arg]
    """The next answer on the stream, past the hold messages (override_message_timeout) sent while it queues."""
    while True:
        response: pb.ProcessingResponse = await asyncio.wait_for(call.read(), 10)
        if not response.HasField("override_message_timeout"):
            return response
        assert response.WhichOneof("response") is None  # a hold is never also an answer
        if holds is not None:
            holds.append(response.override_message_timeout.ToMilliseconds() / 1000)


async def test_a_queued_stream_stays_open_and_is_answered_with_the_decision_when_the_pool_drains(stack) -> None:
    channel, call = await _open(stack.port)
    read = asyncio.ensure_future(_answer(call))
    await asyncio.sleep(0.5)  # longer than the idle timeout
    assert not read.done() and stack.gate.controller.count == 1
    stack.drain()  # new scrape data wakes the dispatch task
    first: pb.ProcessingResponse = await asyncio.wait_for(read, 10)
    assert first.WhichOneof("response") == "request_headers"
    headers = {
        h.header.key: h.header.raw_value.decode() for h in first.request_headers.response.header_mutation.set_headers
    }
    assert headers["x-gateway-destination-endpoint"] == ADDRESS
    await call.done_writing()
    await channel.close()


async def test_a_client_that_goes_away_frees_its_place_at_once(stack) -> None:
    channel, call = await _open(stack.port)
    for _ in range(100):
        if stack.gate.controller.count == 1:
            break
        await asyncio.sleep(0.01)
    assert stack.gate.controller.count == 1
    call.cancel()
    await channel.close()
    for _ in range(100):
        if stack.gate.controller.count == 0:
            break
        await asyncio.sleep(0.01)
    assert stack.gate.controller.count == 0 and stack.processor.open_streams == 0


async def test_ttl_expiry_answers_429_with_the_dropped_reason_header() -> None:
    s = _Stack(ttl_s=0.3)
    s.gate.start()
    await s.grpc.start()
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.05)
            s.now = 100.0 + loop.time() - start

    ticker = asyncio.ensure_future(tick())
    try:
        channel, call = await _open(s.port)
        response = await _answer(call)
        assert response.WhichOneof("response") == "immediate_response"
        immediate = response.immediate_response
        assert immediate.status.code == 429
        headers = {h.header.key: h.header.raw_value.decode() for h in immediate.headers.set_headers}
        assert headers["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"
        await channel.close()
    finally:
        ticker.cancel()
        await s.gate.shutdown(0)
        await s.grpc.stop(0)


async def test_a_queued_stream_asks_envoy_to_keep_waiting_at_once_and_again_while_it_waits(
    stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Envoy's per-message timer (1 s in the rendered config) runs while the request waits in our queue; the
    picker restarts it with override_message_timeout when it queues the request and every half hold after."""
    monkeypatch.setattr(wire, "QUEUE_HOLD_S", 0.2)
    channel, call = await _open(stack.port)
    holds: list[float] = []
    read = asyncio.ensure_future(_answer(call, holds))
    await asyncio.sleep(0.65)
    assert not read.done() and stack.gate.controller.count == 1
    assert len(holds) >= 3 and set(holds) == {0.2}  # at once, then every 0.1 s
    stack.drain()
    answer = await asyncio.wait_for(read, 10)
    assert answer.WhichOneof("response") == "request_headers"  # the decision, after the holds
    await call.done_writing()
    await channel.close()


async def test_a_request_with_room_gets_its_decision_without_a_hold(stack) -> None:
    stack.drain()
    channel, call = await _open(stack.port)
    first: pb.ProcessingResponse = await asyncio.wait_for(call.read(), 10)
    assert not first.HasField("override_message_timeout")
    assert first.WhichOneof("response") == "request_headers"
    await call.done_writing()
    await channel.close()


# -- in-flight eviction (enableEviction) ---------------------------------------------------------------------------


class _EvictionStack:
    """One endpoint, concurrency-detector with maxConcurrency 1: one request in flight saturates the pool."""

    def __init__(self) -> None:
        self.table = EndpointTable()
        self.slot = self.table.upsert(EndpointInfo(address=ADDRESS))
        self.table.record_scrape(self.slot, MetricsSample(waiting=0, kv_usage=0.0), now=0.0)
        objectives = ObjectiveStore()
        objectives.put_objective("critical", 10)
        objectives.put_objective("batch", -1)
        detector = ConcurrencyDetector(max_concurrency=1)
        self.registry = CollectorRegistry()
        self.metrics = FlowControlMetrics(self.registry, lambda: "pool", lambda: self.gate.queue_state())
        self.gate = FlowGate(
            FlowController(FlowSettings(spec=FlowControlSpec(enable_eviction=True))),
            self.table,
            PoolGauge(detector, detector.freshness),
            time.monotonic,
            objectives=objectives,
            observer=self.metrics,
            reclaimer=Reclaimer(confirmation_grace(True, 0.05, 0.2)),
        )
        director = Director(
            self.table, Scheduler(RandomScheduler(seed=1)), clock=time.monotonic, objectives=objectives, flow=self.gate
        )
        self.processor = ExternalProcessor(director, PickerMetrics(CollectorRegistry()), StreamSettings())
        self.grpc = grpc.aio.server()
        add_to_server(self.processor, self.grpc)
        self.port = self.grpc.add_insecure_port("127.0.0.1:0")

    async def open(self, objective: str) -> tuple[grpc.aio.Channel, grpc.aio.StreamStreamCall]:  # type: ignore[type-arg]
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        await call.write(headers_msg(extra={"x-llm-d-inference-objective": objective}))
        await call.write(body_msg(BODY, end_of_stream=True))
        return channel, call


@pytest.fixture
async def evicting() -> AsyncIterator[_EvictionStack]:
    s = _EvictionStack()
    s.gate.start()
    await s.grpc.start()
    yield s
    await s.gate.shutdown(0)
    await s.grpc.stop(0)


def _immediate_headers(response: pb.ProcessingResponse) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in response.immediate_response.headers.set_headers}


async def test_a_sheddable_request_in_flight_is_evicted_with_429_for_a_blocked_critical_one(evicting) -> None:
    s = evicting
    shed_channel, shed = await s.open("batch")
    decided = await _answer(shed)
    assert decided.WhichOneof("response") == "request_headers"  # sent on: in flight, booked
    assert int(s.table.view().inflight[s.slot]) == 1
    assert (await _answer(shed)).WhichOneof("response") == "request_body"  # the body goes on (full duplex)
    crit_channel, critical = await s.open("critical")  # the pool is full (1 of 1): it queues ...
    evicted = await _answer(shed)  # ... and the sheddable request is ended to make room
    assert evicted.WhichOneof("response") == "immediate_response"
    assert evicted.immediate_response.status.code == 429
    assert _immediate_headers(evicted)["x-llm-d-request-dropped-reason"] == "evicted"
    served = await _answer(critical)
    assert served.WhichOneof("response") == "request_headers"  # dispatched into the freed room
    assert int(s.table.view().inflight[s.slot]) == 1  # the evicted booking was released, the critical one held
    r = s.gate.reclaimer
    assert r is not None and r.issued == {10: 1} and r.evictable_count == 0
    for _ in range(100):  # the evicted stream's end confirms the revocation
        if r.confirmed == 1:
            break
        await asyncio.sleep(0.01)
    assert r.confirmed == 1 and r.timed_out == 0
    get = s.registry.get_sample_value
    pool = {"inference_pool": "pool"}
    assert get("llm_d_epp_flow_control_revocations_issued_total", {"priority": "10", **pool}) == 1.0
    assert get("llm_d_epp_flow_control_revocations_total", {"outcome": "confirmed", **pool}) == 1.0
    assert get("llm_d_epp_flow_control_revocations_total", {"outcome": "timed_out", **pool}) == 0.0
    assert get("llm_d_epp_flow_control_revocation_confirmation_seconds_count", pool) == 1.0
    assert get("llm_d_epp_flow_control_reclaim_target", pool) == 0.0  # saturation 1.0 at ceiling 1.0
    assert get("llm_d_epp_flow_control_pending_reclaim", pool) is not None
    for channel in (shed_channel, crit_channel):
        await channel.close()


async def test_a_critical_request_in_flight_is_never_evicted(evicting) -> None:
    s = evicting
    first_channel, first = await s.open("critical")
    assert (await _answer(first)).WhichOneof("response") == "request_headers"
    second_channel, second = await s.open("critical")
    assert (await _answer(first)).WhichOneof("response") == "request_body"
    read = asyncio.ensure_future(_answer(second))
    after = asyncio.ensure_future(first.read())
    await asyncio.sleep(0.3)
    assert not read.done() and not after.done()  # the second waits; the first runs on, unanswered
    assert s.gate.reclaimer is not None and s.gate.reclaimer.issued == {}
    after.cancel()
    read.cancel()
    for channel in (first_channel, second_channel):
        await channel.close()


async def test_a_sheddable_request_whose_response_ended_is_no_longer_a_victim(evicting) -> None:
    s = evicting
    channel, call = await s.open("batch")
    assert (await _answer(call)).WhichOneof("response") == "request_headers"
    assert (await _answer(call)).WhichOneof("response") == "request_body"
    r = s.gate.reclaimer
    assert r is not None and r.evictable_count == 1
    await call.write(response_headers(end_of_stream=True))  # the whole response: headers only
    assert (await _answer(call)).WhichOneof("response") == "response_headers"
    for _ in range(100):
        if r.evictable_count == 0:
            break
        await asyncio.sleep(0.01)
    assert r.evictable_count == 0 and r.victim_priority() is None
    await call.done_writing()
    await channel.close()
