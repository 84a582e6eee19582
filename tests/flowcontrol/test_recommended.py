"""The flow-control configuration docs/flow-control.md recommends
(benchmarks/configs/flow-control-self-calibrating.yaml), and the threshold one beside it for a measured pool
(benchmarks/configs/flow-control.yaml): contention is resolved in the picker's queue, where priority and fairness
apply, not in the engines' own queues. The threshold file holds from the first request at one request per endpoint
waiting inside the engines; the self-calibrating one does once its knees are learned (tests/scheduling/test_knee.py),
and in its slow start takes up to `PACE` × the load each engine's last scrape showed.

Each test drives the real queues with the config's own settings and the pool detector `epp serve` builds from it;
time is an argument, picks are booked in the endpoint table as the director books them."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.app.config_file import load_config
from epp.datastore import EndpointTable
from epp.datastore.table import MetricsSample
from epp.flowcontrol import FlowController, QueuedRequest
from epp.flowcontrol.gauge import PoolGauge
from epp.flowcontrol.policies import PriorityHoldback, RoundRobinFairness
from epp.scheduling import build_scheduler
from epp.scheduling.knee import PACE, KneeDetector
from epp.scheduling.saturation import SaturationDetector
from tests.scheduling.tables import NOW, table_with

CONFIGS = Path(__file__).parents[2] / "benchmarks" / "configs"
RECOMMENDED = CONFIGS / "flow-control-self-calibrating.yaml"
THRESHOLD = CONFIGS / "flow-control.yaml"
BOTH = pytest.mark.parametrize("path", [RECOMMENDED, THRESHOLD], ids=["recommended", "threshold"])


def _built(path: Path) -> tuple[FlowController, PoolGauge]:
    scheduler = build_scheduler(load_config(path, allow_experimental=True, warn=False), allow_experimental=True)
    assert scheduler.flow is not None
    return FlowController(scheduler.flow), PoolGauge(scheduler.saturation, scheduler.freshness)


def _pool(endpoints: int, kv: float = 0.5) -> EndpointTable:
    # kv 0.5 of 0.8: the engines' batches are busy (KV term 0.625) but nothing waits in them
    return table_with([dict(waiting=0, running=200, kv_usage=kv)] * endpoints)


def _dispatch_all(fc: FlowController, gauge: PoolGauge, table: EndpointTable, now: float) -> list[QueuedRequest]:
    """Dispatch until the gate holds, booking each pick on the endpoint with the fewest picks since its scrape."""
    out = []
    while True:
        snap = table.view()
        item = fc.dispatch(gauge.saturation(snap, snap.slots, now), now)
        if item is None:
            return out
        table.book_pick(int(snap.slots[snap.picks_since_scrape[snap.slots].argmin()]))
        out.append(item)


def _scrape(table: EndpointTable, waiting: float, now: float, kv: float = 0.5) -> None:
    for slot in table.view().slots:
        table.record_scrape(int(slot), MetricsSample(waiting=waiting, running=200, kv_usage=kv), now=now)


def test_the_recommended_config_is_the_self_calibrating_detector_round_robin_and_priority_holdback() -> None:
    scheduler = build_scheduler(load_config(RECOMMENDED, allow_experimental=True, warn=False), allow_experimental=True)
    assert isinstance(scheduler.saturation, KneeDetector)
    settings = scheduler.flow
    assert settings is not None
    assert settings.usage_limit == PriorityHoldback(min_ceiling=0.1, max_ceiling=1.0)
    assert isinstance(settings.fairness(settings.spec.default_band.fairness_policy_ref), RoundRobinFairness)


def test_the_threshold_config_is_the_recommended_one_with_queue_depth_one_in_place_of_the_knee() -> None:
    scheduler = build_scheduler(load_config(THRESHOLD, allow_experimental=True, warn=False), allow_experimental=True)
    assert isinstance(scheduler.saturation, SaturationDetector)
    assert scheduler.saturation.thresholds.queue_depth == 1
    assert scheduler.saturation.thresholds.kv_util == pytest.approx(0.8)
    recommended = load_config(RECOMMENDED, allow_experimental=True, warn=False)
    threshold = load_config(THRESHOLD, allow_experimental=True, warn=False)
    detectors = {"self-calibrating-detector", "utilization-detector"}
    assert [p for p in recommended.plugins if p.type not in detectors] == [
        p for p in threshold.plugins if p.type not in detectors
    ]
    settings = scheduler.flow
    assert settings is not None
    assert settings.usage_limit == PriorityHoldback(min_ceiling=0.1, max_ceiling=1.0)
    assert isinstance(settings.fairness(settings.spec.default_band.fairness_policy_ref), RoundRobinFairness)


def test_dispatch_holds_once_one_request_per_endpoint_would_wait_inside_the_engines() -> None:
    fc, gauge = _built(THRESHOLD)
    table = _pool(4)
    for i in range(20):
        assert fc.enqueue(QueuedRequest(ticket=i, flow_id="heavy"), NOW) is None
    sent = _dispatch_all(fc, gauge, table, NOW)
    # one pick per endpoint since the scrape: the mean predicted engine queue reaches queueDepthThreshold 1
    assert len(sent) == 4
    assert fc.count == 16
    # until the next scrape shows the engines took them into their batches, the rest wait in the picker
    assert _dispatch_all(fc, gauge, table, NOW + 0.01) == []
    _scrape(table, waiting=0, now=NOW + 0.05)
    assert len(_dispatch_all(fc, gauge, table, NOW + 0.05)) == 4


def test_in_its_slow_start_the_recommended_config_takes_up_to_pace_times_what_each_scrape_showed() -> None:
    fc, gauge = _built(RECOMMENDED)
    table = _pool(4)
    for i in range(400):
        assert fc.enqueue(QueuedRequest(ticket=i, flow_id="heavy"), NOW) is None
    table.view()  # the scrapes read: 200 running in each engine, none of them ours
    sent = _dispatch_all(fc, gauge, table, NOW)
    assert len(sent) == 4 * int(PACE * 200 - 200)  # then full until the next scrape shows the engines took them
    assert _dispatch_all(fc, gauge, table, NOW + 0.01) == []


def test_upstreams_default_queue_depth_lets_five_per_endpoint_queue_inside_the_engines() -> None:
    scheduler = build_scheduler(load_config(None, text=_DEFAULTS, warn=False))
    assert scheduler.flow is not None
    fc, gauge = FlowController(scheduler.flow), PoolGauge(scheduler.saturation, scheduler.freshness)
    table = _pool(4)
    for i in range(40):
        fc.enqueue(QueuedRequest(ticket=i), NOW)
    assert len(_dispatch_all(fc, gauge, table, NOW)) == 20  # queueDepthThreshold 5 × 4 endpoints


@BOTH
def test_a_scrape_showing_a_waiting_engine_keeps_the_backlog_in_the_picker(path: Path) -> None:
    fc, gauge = _built(path)
    table = _pool(2)
    _scrape(table, waiting=1, now=NOW)  # each engine has one request waiting for a batch slot
    fc.enqueue(QueuedRequest(ticket=0), NOW)
    assert _dispatch_all(fc, gauge, table, NOW) == []
    _scrape(table, waiting=0, now=NOW + 0.05)
    assert [i.ticket for i in _dispatch_all(fc, gauge, table, NOW + 0.05)] == [0]


def test_a_light_flow_goes_next_however_long_the_heavy_backlog() -> None:
    fc, gauge = _built(THRESHOLD)
    table = _pool(1)
    for i in range(50):
        fc.enqueue(QueuedRequest(ticket=("heavy", i), flow_id="heavy"), NOW)
    assert [i.ticket for i in _dispatch_all(fc, gauge, table, NOW)] == [("heavy", 0)]
    fc.enqueue(QueuedRequest(ticket=("light", 0), flow_id="light"), NOW + 0.01)
    _scrape(table, waiting=0, now=NOW + 0.05)
    assert [i.ticket for i in _dispatch_all(fc, gauge, table, NOW + 0.05)] == [("light", 0)]
    _scrape(table, waiting=0, now=NOW + 0.1)
    assert [i.ticket for i in _dispatch_all(fc, gauge, table, NOW + 0.1)] == [("heavy", 1)]


@BOTH
def test_sheddable_requests_wait_below_the_holdback_ceiling_while_critical_ones_dispatch(path: Path) -> None:
    fc, gauge = _built(path)
    table = _pool(2, kv=0.2)  # KV term 0.25: above the sheddable band's ceiling 0.1, below the critical one's 1.0
    for i in range(3):
        fc.enqueue(QueuedRequest(ticket=("sheddable", i), priority=-1), NOW)
    fc.enqueue(QueuedRequest(ticket=("critical", 0), priority=10), NOW)
    assert [i.ticket for i in _dispatch_all(fc, gauge, table, NOW)] == [("critical", 0)]
    assert fc.count == 3  # head-of-line: the sheddable band waits
    _scrape(table, waiting=0, now=NOW + 0.05, kv=0.04)  # the pool drained: KV term 0.05
    assert [i.ticket for i in _dispatch_all(fc, gauge, table, NOW + 0.05)] == [("sheddable", 0)]


_DEFAULTS = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- {type: utilization-detector}
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: utilization-detector}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
"""
