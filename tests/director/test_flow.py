"""Flow control on the serving path: requests wait as asyncio Futures while the pool is saturated and are
dispatched by the one dispatch task; each outcome is an EppError with upstream's status and reason header. Each
test names the upstream test it mirrors (llm-d-router `pkg/epp/flowcontrol/integration_test.go`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from epp.config.flowcontrol import FlowControlSpec, PriorityBandSpec
from epp.datastore import EndpointTable, Freshness
from epp.datastore.objectives import ObjectiveStore
from epp.datastore.table import EndpointInfo, MetricsSample
from epp.director.flow import FlowGate
from epp.errors import EppError
from epp.flowcontrol import FlowController, FlowSettings
from epp.flowcontrol.eviction import Reclaimer
from epp.flowcontrol.gauge import PoolGauge
from epp.flowcontrol.policies import RoundRobinFairness, StaticUsageLimit
from epp.observability.flow import FlowControlMetrics
from epp.scheduling.saturation import SaturationDetector


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _table(endpoints: int = 1, waiting: float = 0.0, now: float = 100.0) -> EndpointTable:
    table = EndpointTable()
    for i in range(endpoints):
        slot = table.upsert(EndpointInfo(address=f"127.10.0.{i + 1}:8000", labels={}, pod_name=f"p{i}"))
        table.record_scrape(slot, MetricsSample(waiting=waiting, kv_usage=0.0), now=now)
    return table


def _objectives() -> ObjectiveStore:
    store = ObjectiveStore()
    store.put_objective("critical", 10)
    store.put_objective("sheddable", -1)
    return store


def _gate(table: EndpointTable, clock: Clock, spec: FlowControlSpec | None = None, **settings: object) -> FlowGate:
    flow = FlowSettings(spec=spec or FlowControlSpec(), **settings)  # type: ignore[arg-type]
    detector = SaturationDetector(freshness=Freshness(staleness_s=1000.0))
    gate = FlowGate(FlowController(flow), table, PoolGauge(detector, detector.freshness), clock, _objectives())
    gate.start()
    return gate


def headers(objective: str | None = None, flow: str | None = None) -> dict[str, str]:
    h = {":path": "/v1/completions"}
    if objective:
        h["x-llm-d-inference-objective"] = objective
    if flow:
        h["x-llm-d-inference-fairness-id"] = flow
    return h


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def _decide(gate: FlowGate, table: EndpointTable, slot: int = 0) -> None:
    """What the stream does after admit: decide (book the pick) and report it."""
    table.book_pick(slot)
    gate.decided()


async def test_saturation_full_loop_a_request_waits_and_is_served_when_the_pool_drains() -> None:
    """Upstream: TestSaturationFullLoop."""
    clock, table = Clock(), _table(waiting=9)  # saturation 1.8
    gate = _gate(table, clock)
    waiter = asyncio.ensure_future(gate.admit(headers(), 10))
    await _settle()
    assert not waiter.done() and gate.controller.count == 1
    table.record_scrape(0, MetricsSample(waiting=1, kv_usage=0.0), now=clock.now)  # the queue drained: scrape wakes
    await asyncio.wait_for(waiter, 5)
    assert gate.controller.count == 0
    await gate.shutdown(0)


async def test_priority_backpressure_critical_goes_first_sheddable_waits() -> None:
    """Upstream: TestPriorityBackpressure."""
    clock, table = Clock(), _table(waiting=9)
    gate = _gate(table, clock)
    order: list[str] = []

    async def one(objective: str) -> None:
        await gate.admit(headers(objective), 0)
        order.append(objective)
        await _decide(gate, table)

    shed = asyncio.ensure_future(one("sheddable"))
    await _settle()
    crit = asyncio.ensure_future(one("critical"))
    await _settle()
    table.record_scrape(0, MetricsSample(waiting=0, kv_usage=0.0), now=clock.now)
    await asyncio.wait_for(asyncio.gather(shed, crit), 5)
    assert order == ["critical", "sheddable"]
    await gate.shutdown(0)


async def test_fairness_round_robin_the_light_flow_is_not_stuck_behind_the_heavy_one() -> None:
    """Upstream: TestFairnessRoundRobin."""
    clock, table = Clock(), _table(waiting=9)
    gate = _gate(table, clock, fairness=lambda ref: RoundRobinFairness())
    order: list[str] = []

    async def one(flow: str) -> None:
        await gate.admit(headers(flow=flow), 0)
        order.append(flow)
        gate.decided()

    tasks = [asyncio.ensure_future(one("heavy")) for _ in range(6)]
    await _settle()
    tasks += [asyncio.ensure_future(one("light")) for _ in range(2)]
    await _settle()
    table.record_scrape(0, MetricsSample(waiting=0, kv_usage=0.0), now=clock.now)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order[:4] == ["heavy", "light", "heavy", "light"]
    await gate.shutdown(0)


async def test_the_fair_share_gate_holds_an_over_share_flow_on_the_fast_path_too() -> None:
    """Ours: requests that pass without queueing count toward the shares, and an over-share one must queue."""
    clock, table = Clock(), _table(waiting=3)  # saturation 0.6, over 0.5 x the ceiling 1.0
    gate = _gate(table, clock, fairness=lambda ref: RoundRobinFairness(over_share=0.5))
    for flow in ("heavy", "light", "heavy"):  # shares 0:0, 1:0, 1:1: never more than an equal share
        assert gate.enter(headers(flow=flow), 0) is None
        gate.decided()
    held = gate.enter(headers(flow="heavy"), 0)
    assert held is not None  # heavy would have 2 of 3: over its share, it waits in the queue
    assert not await gate.wait(held, timeout=0.05)  # and the dispatch task holds it at this saturation
    light = gate.enter(headers(flow="light"), 0)
    assert light is not None  # something waits, so it queues too, and is sent on at once
    assert await gate.wait(light, timeout=1)
    gate.decided()
    assert await gate.wait(held, timeout=1)  # 2 of 4 now: an equal share, so heavy goes next
    gate.decided()
    await gate.shutdown(0)


async def test_usage_limit_threshold_gates_dispatch() -> None:
    """Upstream: TestUsageLimitThresholdGatesDispatch: at saturation 0.6 a 0.5 threshold holds the request."""
    clock, table = Clock(), _table(waiting=3)
    gate = _gate(table, clock, usage_limit=StaticUsageLimit(0.5))
    waiter = asyncio.ensure_future(gate.admit(headers(), 0))
    await _settle()
    assert not waiter.done()
    table.record_scrape(0, MetricsSample(waiting=2, kv_usage=0.0), now=clock.now)  # 0.4
    await asyncio.wait_for(waiter, 5)
    await gate.shutdown(0)


async def test_global_and_band_capacity_reject_with_429_rejected_saturated() -> None:
    """Upstream: TestGlobalAndBandCapacityInteraction and TestByteCapacityEnforcement."""
    clock, table = Clock(), _table(waiting=9)
    spec = FlowControlSpec(max_requests=2, bands=(PriorityBandSpec(priority=0, max_bytes=100),))
    gate = _gate(table, clock, spec)
    first = asyncio.ensure_future(gate.admit(headers(), 60))
    await _settle()
    with pytest.raises(EppError) as band:
        await gate.admit(headers(), 60)  # the band's byte cap: 120 > 100
    second = asyncio.ensure_future(gate.admit(headers("critical"), 0))
    await _settle()
    with pytest.raises(EppError) as glob:
        await gate.admit(headers("sheddable"), 0)  # the global request cap (2)
    for err in (band.value, glob.value):
        assert err.code.http_status == 429 and err.dropped_reason == "rejected-saturated"
    await gate.shutdown(0)
    for waiter in (first, second):
        with pytest.raises(EppError):
            await waiter


async def test_empty_pool_rejects_as_no_endpoints_with_503() -> None:
    """Upstream: TestEmptyPoolRejectsAsNoEndpoints and TestNoEndpointBudget*: an empty pool waits its
    no-endpoint budget, then 503 rejected-no-endpoints; with a budget of 0 at once."""
    clock, table = Clock(), EndpointTable()
    gate = _gate(table, clock, FlowControlSpec(no_endpoint_request_ttl_s=0.0))
    with pytest.raises(EppError) as now:
        await gate.admit(headers(), 0)
    assert now.value.code.http_status == 503 and now.value.dropped_reason == "rejected-no-endpoints"
    await gate.shutdown(0)
    gate = _gate(table, clock, FlowControlSpec(no_endpoint_request_ttl_s=0.05))
    with pytest.raises(EppError) as later:
        await asyncio.wait_for(_admit_with_clock(gate, clock), 5)
    assert later.value.code.http_status == 503 and later.value.dropped_reason == "rejected-no-endpoints"
    await gate.shutdown(0)


async def _admit_with_clock(gate: FlowGate, clock: Clock, step: float = 0.02) -> None:
    """Admit while the test's clock follows the loop's (the gate's timer runs on the loop's own clock)."""
    loop = asyncio.get_running_loop()
    start, base = loop.time(), clock.now
    waiter = asyncio.ensure_future(gate.admit(headers("sheddable"), 0))
    while not waiter.done():
        await asyncio.sleep(step)
        clock.now = base + (loop.time() - start)
        gate.wake()
    await waiter


async def test_ttl_expiry_evicts_a_queued_request_with_429_rejected_ttl_expired() -> None:
    """Upstream: TestTTLExpiryEvictsQueuedRequest."""
    clock, table = Clock(), _table(waiting=9)
    gate = _gate(table, clock, FlowControlSpec(default_request_ttl_s=0.05))
    with pytest.raises(EppError) as err:
        await asyncio.wait_for(_admit_with_clock(gate, clock), 5)
    assert err.value.code.http_status == 429 and err.value.dropped_reason == "rejected-ttl-expired"
    assert gate.controller.count == 0
    await gate.shutdown(0)


async def test_caller_cancel_frees_its_place_at_once() -> None:
    """Upstream: TestCallerContextCancellationEvictsRequest."""
    clock, table = Clock(), _table(waiting=9)
    gate = _gate(table, clock, FlowControlSpec(max_requests=1))
    registry = CollectorRegistry()
    gate.observer = FlowControlMetrics(registry, lambda: "pool", gate.queue_state)
    waiter = asyncio.ensure_future(gate.admit(headers(), 5))
    await _settle()
    waiter.cancel()
    await _settle()
    assert gate.controller.count == 0 and gate.controller.bytes == 0
    second = asyncio.ensure_future(gate.admit(headers(), 5))  # the place is free again
    await _settle()
    assert gate.controller.count == 1
    cancelled = registry.get_sample_value(
        "llm_d_epp_flow_control_requests_total",
        {"outcome": "EvictedContextCancelled", "priority": "0", "inference_pool": "pool"},
    )
    assert cancelled == 1.0
    await gate.shutdown(0)
    with pytest.raises(EppError):
        await second


async def test_graceful_shutdown_drains_queued_requests_then_answers_the_rest_503() -> None:
    """Upstream: TestGracefulShutdownDrainsQueuedRequests: during the grace the queue still dispatches; what is
    left is answered 503 rejected-shutting-down; new arrivals get the same. None is dropped."""
    clock, table = Clock(), _table(waiting=9)
    gate = _gate(table, clock)
    waiters = [asyncio.ensure_future(gate.admit(headers(), 0)) for _ in range(3)]
    await _settle()

    async def drain_one() -> None:
        await asyncio.sleep(0.01)
        table.record_scrape(0, MetricsSample(waiting=4.0, kv_usage=0.0), now=clock.now)  # room for one (0.8 + 0.2)

    drainer = asyncio.ensure_future(drain_one())
    await gate.shutdown(0.3)
    await drainer
    results = await asyncio.gather(*waiters, return_exceptions=True)
    served = [r for r in results if r is None]
    refused = [r for r in results if isinstance(r, EppError)]
    assert len(served) == 1 and len(refused) == 2
    assert all(e.code.http_status == 503 and e.dropped_reason == "rejected-shutting-down" for e in refused)
    with pytest.raises(EppError) as late:
        await gate.admit(headers(), 0)
    assert late.value.dropped_reason == "rejected-shutting-down"


async def test_shutdown_ends_the_dispatch_task_when_a_wake_up_lands_in_the_same_turn() -> None:
    """A wake-up (a worker's message, a release) set in the loop turn where shutdown cancels the dispatch task: the
    task still ends. With `asyncio.wait_for` on the wake-up event, Python 3.11 returned the event's result and
    dropped the cancel; the task then waited for a wake-up that never came, and the picker never exited."""
    clock, table = Clock(), _table(waiting=9)
    gate = _gate(table, clock)
    waiter = asyncio.ensure_future(gate.admit(headers(), 0))
    await _settle()  # queued, with its TTL: the dispatch task waits for a wake-up or the TTL's timer
    gate.wake()
    shutting = asyncio.ensure_future(gate.shutdown(0))
    for _ in range(20):  # loop turns, not time: it needs a handful
        await asyncio.sleep(0)
    done = shutting.done()
    shutting.cancel()
    assert done, "shutdown still waits for the dispatch task"
    with pytest.raises(EppError):
        await waiter


async def test_dispatch_waits_for_each_pick_to_be_booked_so_a_burst_cannot_overshoot() -> None:
    """Ours (upstream's overshoot fault): 20 queued requests, a pool with room for 5 before saturation; each
    dispatch is booked in flight before the next cycle reads saturation, so exactly 5 go out until a scrape."""
    clock, table = Clock(), _table(waiting=9)
    gate = _gate(table, clock)
    served: list[int] = []

    async def one(i: int) -> None:
        await gate.admit(headers(), 0)
        await _decide(gate, table)
        served.append(i)

    tasks = [asyncio.ensure_future(one(i)) for i in range(20)]
    await _settle()
    table.record_scrape(0, MetricsSample(waiting=0.0, kv_usage=0.0), now=clock.now)  # room: 5 → saturation 1.0
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(served) == 5 and gate.controller.count == 15
    await gate.shutdown(0)
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_high_concurrency_flow_churn_no_deadlock() -> None:
    """Upstream: TestHighConcurrencyFlowChurnNoDeadlock: 300 requests over 50 flows arrive, some cancel, the pool
    frees room as requests complete; every request ends (served, cancelled or refused) and nothing is left."""
    clock, table = Clock(), _table(endpoints=2, waiting=0)
    gate = _gate(table, clock, fairness=lambda ref: RoundRobinFairness())
    done: list[str] = []

    async def one(i: int) -> None:
        try:
            await gate.admit(headers(flow=f"f{i % 50}"), i)
        except EppError:
            done.append("refused")
            return
        slot = i % 2
        table.book_pick(slot)
        gate.decided()
        await asyncio.sleep(0.001 * (i % 3))
        table.release_pick(slot)
        table.record_scrape(slot, MetricsSample(waiting=0.0, kv_usage=0.0), now=clock.now)
        done.append("served")

    tasks = [asyncio.ensure_future(one(i)) for i in range(300)]
    for t in tasks[::7]:
        t.cancel()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
    cancelled = sum(isinstance(r, asyncio.CancelledError) for r in results)
    assert len(done) + cancelled == 300 and gate.controller.count == 0
    await gate.shutdown(0)


async def test_flow_control_metrics_emitted() -> None:
    """Upstream: TestFlowControlMetricsEmitted: queue duration by outcome, queue size and bytes, saturation,
    cycle duration, requests total, in both spellings."""
    clock, table = Clock(), _table(waiting=9)
    gate = _gate(table, clock)
    registry = CollectorRegistry()
    gate.observer = FlowControlMetrics(registry, lambda: "pool", gate.queue_state)
    waiter = asyncio.ensure_future(gate.admit(headers(flow="team-a"), 42))
    await _settle()
    get: Callable[..., float | None] = registry.get_sample_value
    for prefix in ("llm_d_epp_", "inference_extension_"):
        labels = {"fairness_id": "team-a", "priority": "0", "inference_pool": "pool", "model_name": "",
                  "target_model_name": ""}  # fmt: skip
        assert get(prefix + "flow_control_queue_size", labels) == 1.0
        assert get(prefix + "flow_control_queue_bytes", labels) == 42.0
        assert get(prefix + "flow_control_pool_saturation", {"inference_pool": "pool", "stage": "effective"}) == 1.8
        assert (get(prefix + "flow_control_dispatch_cycle_duration_seconds_count", {}) or 0) >= 1
    table.record_scrape(0, MetricsSample(waiting=0.0, kv_usage=0.0), now=clock.now)
    await asyncio.wait_for(waiter, 5)
    gate.decided()
    dispatched = {"fairness_id": "team-a", "priority": "0", "outcome": "Dispatched", "inference_pool": "pool",
                  "model_name": "", "target_model_name": ""}  # fmt: skip
    assert get("llm_d_epp_flow_control_request_queue_duration_seconds_count", dispatched) == 1.0
    assert (
        get(
            "llm_d_epp_flow_control_requests_total",
            {"outcome": "Dispatched", "priority": "0", "inference_pool": "pool"},
        )
        == 1.0
    )
    await gate.shutdown(0)


async def test_the_eviction_series_are_exported_only_with_eviction_on() -> None:
    """Upstream's revocation and reclaim series exist only with enableEviction (tests/extproc covers them on)."""
    clock, table = Clock(), _table(waiting=0)
    names = (
        "revocations_issued", "revocations", "reclaim_target", "pending_reclaim", "revocation_confirmation_seconds"
    )  # fmt: skip
    for reclaimer, exported in ((None, set()), (Reclaimer(0.5), set(names))):
        gate = _gate(table, clock)
        gate.reclaimer = reclaimer
        registry = CollectorRegistry()
        FlowControlMetrics(registry, lambda: "pool", gate.queue_state)
        families = {m.name.removeprefix("llm_d_epp_flow_control_") for m in registry.collect()}
        assert families & set(names) == exported
        await gate.shutdown(0)


async def test_an_unsaturated_pool_lets_requests_through_without_queueing() -> None:
    clock, table = Clock(), _table(waiting=0)
    gate = _gate(table, clock)
    await gate.admit(headers(), 0)  # no await on a future: the common path
    gate.decided()
    assert gate.controller.count == 0
    report = gate.report(clock.now)
    assert report["queued"] == 0 and report["bands"] == [{"priority": 0, "requests": 0, "bytes": 0,
                                                          "oldestWaitSeconds": None, "flows": {}}]  # fmt: skip
    await gate.shutdown(0)
