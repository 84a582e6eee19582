"""Local saturation (when overflow starts) and the residency cache."""

import math

import numpy as np
import pytest

from epp.config.federation import parse_federation
from epp.datastore import EndpointInfo, EndpointTable, Freshness, MetricsSample
from epp.federation.policy import SaturationConfig, locally_saturated
from epp.federation.policy.residency import Residency, allowance_for

NOW = 100.0
CFG = SaturationConfig(queue_depth_threshold=5, kv_cache_util_threshold=0.8, freshness=Freshness(2.0, max_failures=3))


def _one(sample: MetricsSample | None, scraped_at: float = NOW, picks: int = 0, failed: int = 0) -> bool:
    table = EndpointTable()
    slot = table.upsert(EndpointInfo(address="127.10.0.1:8000"))
    if sample is not None:
        table.record_scrape(slot, sample, scraped_at)
    for _ in range(failed):
        table.record_scrape_failure(slot)
    for _ in range(picks):
        table.book_pick(slot)
    snap = table.snapshot()
    return locally_saturated(snap, snap.slots, NOW, CFG)


CASES = [
    (MetricsSample(waiting=0, kv_usage=0.1), {}, False, "idle"),
    (MetricsSample(waiting=4, kv_usage=0.79), {}, False, "just-under-both"),
    (MetricsSample(waiting=5, kv_usage=0.1), {}, True, "queue-at-threshold"),
    (MetricsSample(waiting=0, kv_usage=0.8), {}, True, "kv-at-threshold"),
    (MetricsSample(waiting=3, kv_usage=0.1), {"picks": 2}, True, "own-picks-count-as-queue"),
    (MetricsSample(waiting=math.nan, kv_usage=math.nan), {}, False, "engine-without-those-metrics"),
    (MetricsSample(waiting=0), {"scraped_at": NOW - 2.0}, False, "age-at-staleness-bound"),
    (MetricsSample(waiting=0), {"scraped_at": NOW - 2.5}, True, "stale-metrics"),
    (MetricsSample(waiting=0), {"failed": 3}, True, "failing-max-failures-in-a-row"),
    (MetricsSample(waiting=0), {"failed": 2}, False, "fewer-failures-still-usable"),
    (None, {}, True, "never-scraped"),
]


@pytest.mark.parametrize(("sample", "kw", "saturated"), [c[:3] for c in CASES], ids=[c[3] for c in CASES])
def test_one_endpoint(sample: MetricsSample | None, kw: dict, saturated: bool) -> None:  # type: ignore[type-arg]
    assert _one(sample, **kw) is saturated


def test_one_endpoint_with_capacity_is_enough_and_only_candidates_count() -> None:
    table = EndpointTable()
    busy = table.upsert(EndpointInfo(address="127.10.0.1:8000"))
    idle = table.upsert(EndpointInfo(address="127.10.0.2:8000"))
    table.record_scrape(busy, MetricsSample(waiting=9), NOW)
    table.record_scrape(idle, MetricsSample(waiting=0), NOW)
    snap = table.snapshot()
    assert not locally_saturated(snap, snap.slots, NOW, CFG)
    assert locally_saturated(snap, np.array([busy]), NOW, CFG)
    assert locally_saturated(snap, np.empty(0, dtype=np.int64), NOW, CFG)


def test_residency_cache_answers_like_the_uncached_rules_and_stays_bounded() -> None:
    cfg = parse_federation({"residency": {"rules": [{"name": "r", "modelPrefixes": ["eu/"], "tiers": ["eu"]}]}})
    residency = Residency(cfg, max_cached=8)
    for i in range(50):
        for model in (f"eu/{i}", f"us/{i}"):
            for headers in ({}, {"x-epp-allowed-tiers": "eu"}):
                assert residency.allowance((model,), None, headers) == allowance_for(cfg, model, None, headers)
    assert len(residency._cache) <= 8
