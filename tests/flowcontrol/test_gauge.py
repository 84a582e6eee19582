"""The saturation flow control dispatches on: the pool as it will be (own picks since the scrape), and the
all-stale fallback to the concurrency learned from the last fresh data."""

from __future__ import annotations

import pytest

from epp.datastore import Freshness
from epp.datastore.table import MetricsSample
from epp.flowcontrol.gauge import PoolGauge
from epp.scheduling.saturation import ConcurrencyDetector, SaturationDetector
from tests.scheduling.tables import NOW, table_with


def test_own_picks_since_the_scrape_count_and_the_switch_gives_upstreams_scraped_only_view() -> None:
    table = table_with([dict(waiting=0, kv_usage=0.0)] * 2)
    for _ in range(6):
        table.book_pick(0)
    snap = table.snapshot()
    assert SaturationDetector().saturation(snap, snap.slots, NOW) == pytest.approx(0.6)  # (6/5 + 0) / 2
    assert SaturationDetector(count_own_picks=False).saturation(snap, snap.slots, NOW) == 0.0


def test_all_stale_pool_falls_back_to_the_learned_concurrency_instead_of_freezing() -> None:
    table = table_with([dict(waiting=5, kv_usage=0.0)] * 2)  # saturation 1.0 ...
    for slot in (0, 1):
        for _ in range(4):
            table.book_pick(slot)
    table.record_scrape(0, _sample(5), now=NOW)  # a fresh scrape resets picks since scrape, keeps in flight
    table.record_scrape(1, _sample(5), now=NOW)
    freshness = Freshness(staleness_s=1.0)
    gauge = PoolGauge(SaturationDetector(freshness=freshness), freshness)
    snap = table.snapshot()
    assert gauge.saturation(snap, snap.slots, NOW) == pytest.approx(1.0)
    assert gauge.learned_limit == pytest.approx(8.0)  # 8 in flight at saturation 1.0
    later = NOW + 10.0  # every endpoint stale now
    assert SaturationDetector(freshness=freshness).saturation(snap, snap.slots, later) == 1.0  # upstream: frozen
    assert (
        PoolGauge(SaturationDetector(freshness=freshness), freshness, fallback=False).saturation(
            snap, snap.slots, later
        )
        == 1.0
    )
    for _ in range(4):
        table.release_pick(0)  # requests complete while the metrics are stale
    snap = table.snapshot()
    assert gauge.saturation(snap, snap.slots, later) == pytest.approx(0.5)  # 4 in flight / 8: room again
    assert gauge.last_stale


def test_concurrency_detector_is_in_flight_over_capacity() -> None:
    table = table_with([dict(waiting=0, kv_usage=0.0)] * 2)
    for _ in range(50):
        table.book_pick(1)
    snap = table.snapshot()
    assert ConcurrencyDetector(max_concurrency=100).saturation(snap, snap.slots, NOW) == pytest.approx(0.25)
    assert ConcurrencyDetector().saturation(snap, snap.slots[:0], NOW) == 1.0


def _sample(waiting: float) -> MetricsSample:
    return MetricsSample(waiting=waiting, kv_usage=0.0)
