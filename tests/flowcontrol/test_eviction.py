"""In-flight eviction's decisions (upstream's reclamation controller and eviction policies): which requests, how
many, and when; pure, time given. Mirrors llm-d-router `controller/internal/reclamation_test.go`,
`eviction/queue_test.go` and the policies' tests by behaviour."""

from __future__ import annotations

import pytest

from epp.flowcontrol.eviction import (
    CONFIRMATION_TIMEOUT_S,
    ENGINE_RECLAIM_S,
    LEADING_SENSOR_GRACE_S,
    Reclaimer,
    confirmation_grace,
    demand_band,
)

NOW = 100.0


def test_only_sheddable_requests_are_tracked_for_eviction() -> None:
    r = Reclaimer(grace_s=0.5)
    assert r.track("critical", 0, NOW) is None
    assert r.track("positive", 5, NOW) is None
    assert r.track("sheddable", -1, NOW) is not None
    assert r.evictable_count == 1 and r.victim_priority() == -1


def test_victims_are_the_lowest_priority_then_the_newest_dispatch() -> None:
    r = Reclaimer(grace_s=0.5, max_per_decision=4)
    for name, priority, at in (("old-1", -1, 1.0), ("new-1", -1, 3.0), ("old-5", -5, 1.0), ("new-5", -5, 2.0)):
        r.track(name, priority, at)
    victims = r.reclaim(saturation=2.0, ceiling=1.0, demand_priority=0, in_flight=40, now=NOW)
    assert [v.ticket for v in victims] == ["new-5", "old-5", "new-1", "old-1"]


def test_sizing_is_the_deficit_over_the_mean_footprint_capped_at_two_per_decision() -> None:
    r = Reclaimer(grace_s=0.5)
    for i in range(5):
        r.track(i, -1, NOW + i)
    # credit = 1.1 / 10 in flight = 0.11; deficit 0.1 → 1 revocation
    assert len(r.reclaim(1.1, 1.0, 0, 10, NOW)) == 1
    assert r.reclaim_target == pytest.approx(0.1) and r.pending_reclaim == pytest.approx(0.11)
    r2 = Reclaimer(grace_s=0.5)
    for i in range(5):
        r2.track(i, -1, NOW + i)
    assert len(r2.reclaim(1.5, 1.0, 0, 10, NOW)) == 2  # ceil(0.5 / 0.15) = 4, capped at 2
    assert r2.issued == {0: 2}


def test_at_the_boundary_one_revocation_is_issued_rather_than_none() -> None:
    r = Reclaimer(grace_s=0.5)
    r.track("a", -1, NOW)
    assert len(r.reclaim(1.0, 1.0, 0, 4, NOW)) == 1  # saturation == ceiling still blocks the band


def test_no_victim_sits_at_or_above_the_blocked_band() -> None:
    r = Reclaimer(grace_s=0.5)
    r.track("a", -1, NOW)
    assert r.reclaim(2.0, 1.0, demand_priority=-1, in_flight=1, now=NOW) == []  # same band: no churn
    assert r.reclaim(2.0, 1.0, demand_priority=-2, in_flight=1, now=NOW) == []
    assert r.evictable_count == 1 and r.victim_priority() == -1


def test_nothing_is_evicted_without_requests_in_flight_or_evictable_ones() -> None:
    r = Reclaimer(grace_s=0.5)
    assert r.reclaim(2.0, 1.0, 0, 4, NOW) == []
    r.track("a", -1, NOW)
    assert r.reclaim(2.0, 1.0, 0, 0, NOW) == []
    assert r.reclaim(0.0, 0.0, 0, 4, NOW) == []  # no footprint to size with


def test_pacing_waits_for_confirmation_then_the_grace_before_the_next_decision() -> None:
    r = Reclaimer(grace_s=0.5)
    a = r.track("a", -1, NOW)
    r.track("b", -1, NOW)
    assert r.gate_open(NOW)
    (victim,) = r.reclaim(1.1, 1.0, 0, 10, NOW)
    assert victim is a or victim.ticket == "b"
    assert not r.gate_open(NOW + 1.0)  # outstanding: its stream has not ended
    assert r.untrack(victim, NOW + 1.2) == pytest.approx(1.2)  # the stream ended: confirmed after 1.2 s
    assert r.confirmed == 1
    assert not r.gate_open(NOW + 1.5)  # cooling: the freed capacity is not visible yet
    assert r.next_change() == pytest.approx(NOW + 1.7)
    assert r.gate_open(NOW + 1.7) and r.pending_reclaim == 0.0


def test_an_unconfirmed_revocation_times_out_so_a_hung_stream_cannot_stop_reclamation() -> None:
    r = Reclaimer(grace_s=0.5)
    r.track("a", -1, NOW)
    (victim,) = r.reclaim(1.1, 1.0, 0, 10, NOW)
    assert r.next_change() == pytest.approx(NOW + CONFIRMATION_TIMEOUT_S)
    assert not r.gate_open(NOW + CONFIRMATION_TIMEOUT_S - 0.01)
    assert not r.gate_open(NOW + CONFIRMATION_TIMEOUT_S)  # timed out: now cooling
    assert r.timed_out == 1 and r.confirmed == 0
    assert r.gate_open(NOW + CONFIRMATION_TIMEOUT_S + 0.5)
    assert r.untrack(victim, NOW + 20) is None  # a late end confirms nothing twice


def test_a_request_that_ends_on_its_own_is_no_longer_a_victim() -> None:
    r = Reclaimer(grace_s=0.5)
    a = r.track("a", -1, NOW)
    assert a is not None
    assert r.untrack(a, NOW + 1) is None
    r.untrack(a, NOW + 2)  # idempotent
    assert r.evictable_count == 0 and r.victim_priority() is None
    assert r.reclaim(2.0, 1.0, 0, 4, NOW) == []


@pytest.mark.parametrize(
    ("bands", "ceilings", "saturation", "victim", "expected"),
    [
        pytest.param([(10, 3), (0, 0), (-1, 2)], {10: 1.0, 0: 1.0, -1: 1.0}, 1.0, -1, (10, 1.0), id="top-band"),
        pytest.param([(10, 0), (0, 3)], {10: 1.0, 0: 0.8}, 0.9, -1, (0, 0.8), id="first-band-with-demand"),
        pytest.param([(10, 3), (0, 3)], {10: 0.0, 0: 0.5}, 0.9, -1, (0, 0.5), id="zero-ceiling-skipped"),
        pytest.param([(10, 3)], {10: 1.0}, 0.9, -1, None, id="not-blocked"),
        pytest.param([(0, 0), (-1, 5)], {0: 1.0, -1: 1.0}, 1.2, -1, None, id="only-the-victims-band-waits"),
        pytest.param([(-1, 5)], {-1: 1.0}, 1.2, -5, (-1, 1.0), id="a-sheddable-band-over-a-lower-one"),
    ],
)
def test_the_demand_is_the_first_held_back_band_above_the_next_victim(
    bands, ceilings, saturation, victim, expected
) -> None:
    assert demand_band(bands, ceilings, saturation, victim) == expected


def test_the_grace_follows_the_detectors_lag() -> None:
    assert confirmation_grace(True, 0.05, 0.2) == LEADING_SENSOR_GRACE_S
    assert confirmation_grace(False, 0.05, 0.2) == pytest.approx(0.05 + 0.2 + ENGINE_RECLAIM_S)
