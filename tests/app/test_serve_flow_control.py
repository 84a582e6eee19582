"""`epp serve` wires flow control from the config: `enableEviction` adds in-flight eviction, paced by the lag of
the pool's saturation detector (upstream derives the grace the same way)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from epp.app.serve import _flow_gate
from epp.config.decode import parse_config
from epp.datastore import EndpointTable
from epp.datastore.objectives import ObjectiveStore
from epp.flowcontrol.eviction import ENGINE_RECLAIM_S, LEADING_SENSOR_GRACE_S
from epp.scheduling import build_scheduler


def _gate(detector: str, eviction: bool) -> object:
    doc = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "featureGates": ["flowControl"],
        "plugins": [{"type": detector}, {"type": "queue-scorer"}, {"type": "max-score-picker"}],
        "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "queue-scorer"}]}],
        "flowControl": {"enableEviction": eviction, "saturationDetector": {"pluginRef": detector}},
    }
    scheduler = build_scheduler(parse_config(doc))
    state = SimpleNamespace(table=EndpointTable(), objectives=ObjectiveStore())
    return _flow_gate(scheduler, state, 0.05)  # type: ignore[arg-type]


def test_enable_eviction_builds_in_flight_eviction_paced_by_the_detectors_lag() -> None:
    leading = _gate("concurrency-detector", True).reclaimer  # type: ignore[attr-defined]
    assert leading is not None and leading.grace_s == LEADING_SENSOR_GRACE_S
    scraped = _gate("utilization-detector", True)
    grace = scraped.reclaimer.grace_s  # type: ignore[attr-defined]
    staleness = scraped._gauge.freshness.staleness_s  # type: ignore[attr-defined]
    assert grace == pytest.approx(0.05 + staleness + ENGINE_RECLAIM_S)


def test_without_enable_eviction_nothing_in_flight_is_ever_evicted() -> None:
    gate = _gate("concurrency-detector", False)
    assert gate.reclaimer is None and not gate.evicting  # type: ignore[attr-defined]
