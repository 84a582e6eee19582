"""Admission plugins: probabilistic shedding of sheddable traffic, and the latency-SLO admitter without a
latency predictor (idle, cold, or the band's oldest wait within the SLO)."""

from __future__ import annotations

import pytest

from epp.flowcontrol import QueuedRequest
from epp.flowcontrol.admission import LatencySloAdmitter, ProbabilisticAdmitter
from epp.scheduling.saturation import SaturationDetector
from tests.scheduling.tables import NOW, table_with


def item(priority: int = -1, slo: float | None = None) -> QueuedRequest:
    return QueuedRequest(ticket=None, priority=priority, slo_ttft_s=slo)


def test_probabilistic_admitter_sheds_only_sheddable_traffic_on_upstreams_curve() -> None:
    admitter = ProbabilisticAdmitter(SaturationDetector())
    assert admitter.shed_probability(0.15) == pytest.approx(0.0228, abs=1e-3)  # upstream: ~2.3 % at 0.15
    assert admitter.shed_probability(0.35) == 1.0
    snap = table_with([dict(waiting=5, kv_usage=0.0)]).snapshot()  # saturation 1.0
    assert not admitter.admit(item(), snap, snap.slots, NOW, draw=0.99, oldest_wait_s=0.0)
    assert admitter.admit(item(priority=0), snap, snap.slots, NOW, draw=0.0, oldest_wait_s=0.0)
    idle = table_with([dict(waiting=0, kv_usage=0.0)]).snapshot()
    assert admitter.admit(item(), idle, idle.slots, NOW, draw=0.0, oldest_wait_s=0.0)


def test_latency_slo_admitter_uses_idle_cold_and_the_queue_wait_in_place_of_predictions() -> None:
    admitter = LatencySloAdmitter()
    table = table_with([dict(waiting=3, kv_usage=0.5)])
    snap = table.snapshot()
    assert admitter.admit(item(slo=0.1), snap, snap.slots, NOW, 0.0, oldest_wait_s=9.0)  # idle: nothing in flight
    table.book_pick(0)
    snap = table.snapshot()
    assert admitter.admit(item(slo=1.0), snap, snap.slots, NOW, 0.0, oldest_wait_s=0.5)
    assert not admitter.admit(item(slo=1.0), snap, snap.slots, NOW, 0.0, oldest_wait_s=1.5)
    assert admitter.admit(item(), snap, snap.slots, NOW, 0.0, oldest_wait_s=99.0)  # no SLO header
    cold = table_with([dict(waiting=3, kv_usage=0.01)])
    cold.book_pick(0)
    snap = cold.snapshot()
    assert admitter.admit(item(slo=1.0), snap, snap.slots, NOW, 0.0, oldest_wait_s=5.0)
