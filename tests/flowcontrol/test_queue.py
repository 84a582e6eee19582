"""The flow controller as pure decision code: each of upstream's flow-control behaviours, at the queue level (the
serving-path versions, with streams held open and ImmediateResponses, are in tests/director/test_flow.py)."""

from __future__ import annotations

import random

import pytest

from epp.config.flowcontrol import FlowControlSpec, PriorityBandSpec
from epp.flowcontrol import FlowController, FlowSettings, Outcome, QueuedRequest
from epp.flowcontrol.policies import (
    EdfOrdering,
    GlobalStrictFairness,
    LasFairness,
    PriorityHoldback,
    RoundRobinFairness,
    SloDeadlineOrdering,
    SoftReflectiveCeiling,
    StaticUsageLimit,
    ordering_policy,
)


def item(flow: str = "default-flow", priority: int = 0, size: int = 0, **kw: object) -> QueuedRequest:
    return QueuedRequest(ticket=None, flow_id=flow, priority=priority, size=size, **kw)  # type: ignore[arg-type]


def controller(**spec: object) -> FlowController:
    fairness = spec.pop("fairness", None)
    usage = spec.pop("usage", None)
    settings = FlowSettings(spec=FlowControlSpec(**spec))  # type: ignore[arg-type]
    if fairness is not None:
        settings.fairness = fairness  # type: ignore[assignment]
    if usage is not None:
        settings.usage_limit = usage  # type: ignore[assignment]
    return FlowController(settings)


def test_saturation_full_loop_holds_while_saturated_and_dispatches_when_room() -> None:
    """Upstream: TestSaturationFullLoop."""
    fc = controller()
    a, b = item(), item()
    assert fc.enqueue(a, 0.0) is None and fc.enqueue(b, 0.1) is None
    assert fc.dispatch(saturation=1.0, now=1.0) is None  # saturated: held
    assert fc.dispatch(saturation=0.5, now=2.0) is a  # room: oldest first
    assert fc.dispatch(saturation=0.5, now=2.0) is b
    assert fc.dispatch(saturation=0.5, now=2.0) is None and fc.count == 0


def test_priority_backpressure_blocks_lower_bands_behind_a_held_higher_band() -> None:
    """Upstream: TestPriorityBackpressure. Bands highest first; head-of-line at the first band over its ceiling."""
    fc = controller(usage=PriorityHoldback(min_ceiling=0.5))
    low, high = item(priority=-1), item(priority=10)
    fc.enqueue(low, 0.0)
    fc.enqueue(high, 1.0)
    assert fc.dispatch(0.0, 2.0) is high  # the higher band first, though it arrived later
    fc.enqueue(high2 := item(priority=10), 3.0)
    assert fc.ceilings(0.7) == {10: 1.0, -1: 0.5}
    assert fc.dispatch(0.7, 4.0) is high2  # critical passes at 0.7
    assert fc.dispatch(0.7, 4.0) is None  # sheddable held back at 0.7 (its ceiling 0.5)
    assert fc.dispatch(0.4, 5.0) is low
    # Head-of-line: a saturated higher band stops the walk even when a lower band's ceiling would allow it.
    fc2 = controller(usage=StaticUsageLimit(threshold=0.8))
    fc2.enqueue(item(priority=5), 0.0)
    fc2.enqueue(item(priority=1), 0.0)
    assert fc2.dispatch(0.9, 1.0) is None and fc2.count == 2


def test_round_robin_fairness_alternates_flows_whatever_their_backlog() -> None:
    """Upstream: TestFairnessRoundRobin."""
    fc = controller(fairness=lambda ref: RoundRobinFairness())
    for i in range(10):
        fc.enqueue(item("heavy"), float(i))
    fc.enqueue(item("light"), 20.0)
    fc.enqueue(item("light"), 21.0)
    order = [fc.dispatch(0.0, 30.0) for _ in range(4)]
    assert [o.flow_id for o in order if o] == ["heavy", "light", "heavy", "light"]


def test_global_strict_fairness_is_one_queue_in_arrival_order() -> None:
    fc = controller(fairness=lambda ref: GlobalStrictFairness())
    for i, flow in enumerate(["b", "a", "b", "a"]):
        fc.enqueue(item(flow, received_at=float(i)), float(i))
    assert [fc.dispatch(0.0, 9.0).enqueued_at for _ in range(4)] == [0.0, 1.0, 2.0, 3.0]  # type: ignore[union-attr]


def test_las_fairness_serves_the_flow_with_least_attained_service() -> None:
    fc = controller(fairness=lambda ref: LasFairness())
    for i in range(6):
        fc.enqueue(item("heavy"), float(i))
    fc.enqueue(item("light"), 5.5)
    first, second = fc.dispatch(0.0, 6.0), fc.dispatch(0.0, 6.0)
    assert first is not None and second is not None
    assert first.flow_id == "heavy" and second.flow_id == "light"  # heavy now has service, light has none


def test_usage_limit_threshold_gates_dispatch() -> None:
    """Upstream: TestUsageLimitThresholdGatesDispatch."""
    fc = controller(usage=StaticUsageLimit(threshold=0.6))
    fc.enqueue(x := item(), 0.0)
    assert fc.dispatch(0.6, 1.0) is None
    assert fc.dispatch(0.59, 1.0) is x


def test_global_and_band_capacity_interaction() -> None:
    """Upstream: TestGlobalAndBandCapacityInteraction: the tighter cap rejects, as RejectedCapacity."""
    fc = controller(max_requests=3, bands=(PriorityBandSpec(priority=0, max_requests=2),))
    assert fc.enqueue(item(), 0.0) is None and fc.enqueue(item(), 0.0) is None
    assert fc.enqueue(item(), 0.0) is Outcome.REJECTED_CAPACITY  # the band's cap (2)
    assert fc.enqueue(item(priority=1), 0.0) is None  # another band: room globally
    assert fc.enqueue(item(priority=2), 0.0) is Outcome.REJECTED_CAPACITY  # the global cap (3)
    assert Outcome.REJECTED_CAPACITY.status == 429 and Outcome.REJECTED_CAPACITY.reason == "rejected-saturated"


def test_byte_capacity_enforcement() -> None:
    """Upstream: TestByteCapacityEnforcement."""
    fc = controller(max_bytes=1000, bands=(PriorityBandSpec(priority=0, max_bytes=600),))
    assert fc.enqueue(item(size=500), 0.0) is None
    assert fc.enqueue(item(size=200), 0.0) is Outcome.REJECTED_CAPACITY  # band: 700 > 600
    assert fc.enqueue(item(priority=1, size=500), 0.0) is None
    assert fc.enqueue(item(priority=1, size=1), 0.0) is Outcome.REJECTED_CAPACITY  # global: 1001 > 1000
    assert fc.bytes == 1000


def test_empty_pool_rejects_as_no_endpoints() -> None:
    """Upstream: TestEmptyPoolRejectsAsNoEndpoints (no-endpoint budget 0) and TestNoEndpointBudget*."""
    fc = controller(no_endpoint_request_ttl_s=0.0)
    fc.set_pool_empty(True, 0.0)
    assert fc.enqueue(item(), 0.0) is Outcome.REJECTED_NO_ENDPOINTS
    assert Outcome.REJECTED_NO_ENDPOINTS.status == 503
    waits = controller(default_request_ttl_s=60.0, no_endpoint_request_ttl_s=5.0)
    waits.set_pool_empty(True, 0.0)
    assert waits.enqueue(x := item(), 0.0) is None
    assert waits.dispatch(0.0, 1.0) is None  # nothing to send it to
    assert waits.next_expiry() == 5.0
    assert waits.expire(5.0) == [(x, Outcome.REJECTED_NO_ENDPOINTS)]


def test_scale_from_zero_change_of_regime_grants_a_fresh_budget() -> None:
    """Upstream: TestScaleFromZeroOutlivesSaturationBudget."""
    fc = controller(default_request_ttl_s=10.0, no_endpoint_request_ttl_s=30.0)
    fc.set_pool_empty(True, 0.0)
    fc.enqueue(x := item(), 0.0)
    assert fc.expire(25.0) == []  # the no-endpoint budget (30 s) outlives the saturation one (10 s)
    fc.set_pool_empty(False, 25.0)  # endpoints came: a fresh 10 s budget from now
    assert fc.expire(34.0) == [] and fc.expire(35.0) == [(x, Outcome.EVICTED_TTL)]


def test_ttl_expiry_evicts_queued_request() -> None:
    """Upstream: TestTTLExpiryEvictsQueuedRequest."""
    fc = controller(default_request_ttl_s=2.0)
    fc.enqueue(a := item(), 0.0)
    fc.enqueue(b := item(ttl_s=0.5), 0.0)
    fc.enqueue(forever := item(ttl_s=0.0), 0.0)  # 0: no expiry
    assert fc.next_expiry() == 0.5
    assert fc.expire(0.4) == []
    assert fc.expire(0.5) == [(b, Outcome.EVICTED_TTL)]
    assert fc.expire(2.0) == [(a, Outcome.EVICTED_TTL)]
    assert fc.next_expiry() is None and fc.count == 1 and forever.alive
    assert Outcome.EVICTED_TTL.status == 429 and Outcome.EVICTED_TTL.reason == "rejected-ttl-expired"


def test_caller_cancel_frees_its_place_at_once() -> None:
    """Upstream: TestCallerContextCancellationEvictsRequest."""
    fc = controller(max_requests=1)
    fc.enqueue(a := item(size=10), 0.0)
    assert fc.enqueue(item(), 0.0) is Outcome.REJECTED_CAPACITY
    assert fc.cancel(a) and not fc.cancel(a)
    assert fc.count == 0 and fc.bytes == 0 and fc.dispatch(0.0, 1.0) is None
    assert fc.enqueue(item(), 0.0) is None  # its place is free


def test_graceful_shutdown_drain_returns_every_waiter_in_order() -> None:
    """Upstream: TestGracefulShutdownDrainsQueuedRequests: every queued request is answered, none dropped."""
    fc = controller()
    items = [item(priority=p) for p in (1, -1, 0)]
    for i, x in enumerate(items):
        fc.enqueue(x, float(i))
    assert fc.drain() == items and fc.count == 0
    assert Outcome.REJECTED_SHUTDOWN.status == 503 and Outcome.REJECTED_SHUTDOWN.reason == "rejected-shutting-down"


def test_high_concurrency_flow_churn_leaves_consistent_counts() -> None:
    """Upstream: TestHighConcurrencyFlowChurnNoDeadlock (here: 20 000 random operations over 200 flows, counts and
    bytes always consistent, flows leave no state when empty, everything drains)."""
    rng = random.Random(7)
    fc = controller(default_request_ttl_s=5.0, max_requests=500, fairness=lambda ref: RoundRobinFairness())
    live: list[QueuedRequest] = []
    now = 0.0
    for _ in range(20_000):
        now += 0.01
        op = rng.random()
        if op < 0.5:
            x = item(f"flow-{rng.randrange(200)}", priority=rng.choice((-1, 0, 1)), size=rng.randrange(100))
            if fc.enqueue(x, now) is None:
                live.append(x)
        elif op < 0.7 and live:
            fc.cancel(live.pop(rng.randrange(len(live))))
        elif op < 0.95:
            got = fc.dispatch(rng.random() * 1.2, now)
            if got is not None:
                live.remove(got)
        else:
            for x, _ in fc.expire(now):
                live.remove(x)
        assert fc.count == len(live) and fc.bytes == sum(x.size for x in live)
    fc.expire(now + 10.0)
    assert fc.count == 0 and all(not band.flows for band in fc._bands.values())


def test_ordering_policies() -> None:
    """Upstream: TestDispatchOrderingSLODeadline and the per-policy tests: EDF by enqueue + TTL, SLO deadline by
    received + x-llm-d-slo-ttft-ms with requests lacking it last."""
    edf = EdfOrdering()
    assert edf.key(item(ttl_s=1.0, enqueued_at=5.0), 60.0) < edf.key(item(enqueued_at=0.0), 60.0)
    fc = controller(bands=(PriorityBandSpec(priority=0, ordering_policy_ref="slo-deadline-ordering-policy"),))
    fc.enqueue(none := item(received_at=0.0), 0.0)
    fc.enqueue(late := item(received_at=0.0, slo_ttft_s=5.0), 0.1)
    fc.enqueue(soon := item(received_at=0.2, slo_ttft_s=1.0), 0.2)
    assert [fc.dispatch(0.0, 1.0) for _ in range(3)] == [soon, late, none]
    assert isinstance(ordering_policy("slo-deadline-ordering-policy"), SloDeadlineOrdering)


def test_soft_reflective_ceiling_holds_lower_bands_back_as_the_pool_fills() -> None:
    """Upstream's soft-reflective-ceiling: 1 − i·sat/(N−1), gated bands opened one call in round(sat/(1−sat))."""
    policy = SoftReflectiveCeiling()
    assert policy.ceilings([2, 1, 0], 0.0) == {2: 1.0, 1: 1.0, 0: 1.0}
    calls = [policy.ceilings([2, 1, 0], 0.75) for _ in range(6)]  # period round(0.75 / 0.25) = 3
    assert calls[0] == pytest.approx({2: 1.0, 1: 0.625, 0: 0.25})
    assert [c[0] > 0.75 for c in calls] == [False, False, True, False, False, True]


def test_stats_show_bands_queue_lengths_and_oldest_wait() -> None:
    fc = controller()
    fc.enqueue(item("a", size=3), 1.0)
    fc.enqueue(item("b", priority=-1), 2.0)
    fc.enqueue(item("a", size=4), 3.0)
    stats = fc.stats()
    assert [(s.priority, s.requests, s.bytes, s.oldest_enqueued_at) for s in stats] == [(0, 2, 7, 1.0), (-1, 1, 0, 2.0)]
    assert stats[0].flows == {"a": (2, 7)}
