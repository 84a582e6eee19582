"""self-calibrating-detector: knees learned from observations, stale data weighed by confidence, no parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from epp.app.config_file import load_config
from epp.datastore import Freshness, MetricsSample
from epp.datastore.observations import Observation, PickFeatures
from epp.datastore.table import EndpointTable
from epp.errors import ConfigError
from epp.flowcontrol.gauge import PoolGauge
from epp.scheduling import build_scheduler
from epp.scheduling.knee import PACE, STEP_DOWN, STEP_UP, KneeDetector
from tests.scheduling.tables import NOW, address, state, table_with

BASE_TTFT = 0.06  # an unloaded 1,000-token prefill


def _obs(slot: int, load: float, ttft: float, age: float = 0.01, addr: str | None = None) -> Observation:
    pick = PickFeatures(1000, 1000, 0.0, load, 0.1, int(load), NOW, age)
    return Observation(slot, addr or address(slot), pick, ttft, math.nan, 100, True, 0.0, NOW + 1)


def _engine(detector: KneeDetector, slot: int, capacity: int, loads: range, rounds: int = 3) -> None:
    """An engine whose TTFT stays flat up to `capacity` requests and grows with the load past it."""
    for _ in range(rounds):
        for load in loads:
            excess = max(0, load + 1 - capacity)
            detector.observe(_obs(slot, load, BASE_TTFT * (1 + 0.5 * excess)))


def test_each_endpoint_learns_its_own_knee_from_ttft_against_load() -> None:
    detector = KneeDetector()
    _engine(detector, 0, 8, range(0, 30))
    _engine(detector, 1, 120, range(0, 300, 3))
    knees = detector.knees(np.array([0, 1, 2]))
    assert 6 <= knees[0] <= 12
    assert 90 <= knees[1] <= 160
    assert math.isnan(knees[2])  # never observed
    assert not detector.probing(np.array([0, 1])).any()


def test_undelayed_load_raises_the_knee_by_slow_start_before_any_delay() -> None:
    detector = KneeDetector()
    for load in (0, 3, 10):
        detector.observe(_obs(0, load, BASE_TTFT))
    assert detector.knees(np.array([0]))[0] == pytest.approx(22.0)  # 2 × (10 + 1)
    assert detector.probing(np.array([0]))[0]


def test_after_the_slow_start_the_climb_accelerates_while_the_knee_keeps_finding_room() -> None:
    """A slow start ended early (a burst's delay at 15) climbs back fast while requests at the knee are not delayed:
    the probe's step doubles every CLIMB_DOUBLING of them in a row, never past twice the load held; one delay there
    starts the step again from STEP_UP."""
    detector = KneeDetector()
    for load in (0, 7, 14):
        detector.observe(_obs(0, load, BASE_TTFT))
    detector.observe(_obs(0, 14, 5 * BASE_TTFT))  # the burst's delay ends the slow start at 15
    assert not detector.probing(np.array([0]))[0]
    steps = 0
    while detector.knees(np.array([0]))[0] < 200 and steps < 100:
        knee = float(detector.knees(np.array([0]))[0])
        detector.observe(_obs(0, math.ceil(knee) - 1, BASE_TTFT))  # held at the knee, no delay
        assert detector.knees(np.array([0]))[0] <= 2 * math.ceil(knee)
        steps += 1
    assert steps < 40  # ×1.01 a step would take 270
    knee = float(detector.knees(np.array([0]))[0])
    detector.observe(_obs(0, math.ceil(knee) - 1, 5 * BASE_TTFT))  # a delay at the knee: down, the step reset
    after = float(detector.knees(np.array([0]))[0])
    assert after == pytest.approx(knee * (1 - STEP_DOWN))
    detector.observe(_obs(0, math.ceil(after) - 1, BASE_TTFT))
    assert detector.knees(np.array([0]))[0] == pytest.approx(after * (1 + STEP_UP))


def test_a_slot_reused_by_another_endpoint_starts_again() -> None:
    detector = KneeDetector()
    _engine(detector, 0, 8, range(0, 30))
    detector.observe(_obs(0, 2, BASE_TTFT, addr="127.0.0.9:8000"))
    assert detector.knees(np.array([0]))[0] == pytest.approx(6.0)  # slow start from the new endpoint's 3
    assert detector.probing(np.array([0]))[0]


def test_no_ttft_no_learning() -> None:
    detector = KneeDetector()
    detector.observe(_obs(0, 5, math.nan))
    assert detector.observations == 0


def test_saturation_is_load_over_knee_and_a_request_waiting_in_the_engine_counts_full() -> None:
    table = table_with([dict(waiting=0, running=4, kv_usage=0.1), dict(waiting=1, running=4, kv_usage=0.1)])
    snap = table.snapshot()
    detector = KneeDetector()
    assert detector.per_endpoint(snap, snap.slots, NOW).tolist() == pytest.approx([0.1, 1.0])  # cold: KV, queue
    _engine(detector, 0, 8, range(0, 30))
    _engine(detector, 1, 8, range(0, 30))
    knee = detector.knees(snap.slots)
    per = detector.per_endpoint(snap, snap.slots, NOW)
    assert per.tolist() == pytest.approx([4 / knee[0], 1.0])  # the engine's own queue: full, whatever the knee
    assert detector.saturation(snap, snap.slots, NOW) == pytest.approx(per.mean())
    assert detector.saturation(snap, snap.slots[:0], NOW) == 1.0


def test_while_any_endpoint_has_room_none_counts_more_than_full_in_the_pools_saturation() -> None:
    table = table_with([dict(waiting=3, running=4, kv_usage=0.1), dict(waiting=0, running=4, kv_usage=0.1)])
    snap = table.snapshot()
    detector = KneeDetector()
    _engine(detector, 0, 8, range(0, 30))
    _engine(detector, 1, 8, range(0, 30))
    per = detector.per_endpoint(snap, snap.slots, NOW)
    assert per[0] == pytest.approx(3.0) and per[1] < 1.0  # three waiting inside one; room in the other
    assert detector.saturation(snap, snap.slots, NOW) == pytest.approx((1.0 + per[1]) / 2)
    full = table_with([dict(waiting=3, running=4, kv_usage=0.1), dict(waiting=1, running=4, kv_usage=0.1)])
    snap = full.snapshot()
    assert detector.saturation(snap, snap.slots, NOW) == pytest.approx(2.0)  # no room anywhere: the excess, as is


def test_a_request_waiting_inside_counts_full_whatever_the_knee_until_the_next_scrape_is_overdue() -> None:
    table = table_with([dict(waiting=0, running=4, kv_usage=0.1)])
    detector = KneeDetector(freshness=Freshness(staleness_s=2.0))
    _engine(detector, 0, 40, range(0, 60))
    for at in (NOW - 0.05, NOW):  # scraped every 50 ms
        table.record_scrape(0, MetricsSample(waiting=0.0, running=4.0, kv_usage=0.1), now=at)
        snap = table.snapshot()
        detector.per_endpoint(snap, snap.slots, at)
    knee = float(detector.knees(np.array([0]))[0])
    assert knee > 20
    assert detector.per_endpoint(snap, snap.slots, NOW + 0.01).item() == pytest.approx(max(4 / knee, 0.1))
    table.book_pick(0)  # one pick since the scrape: it waits inside until a scrape shows it taken, far below the knee
    snap = table.snapshot()
    assert detector.per_endpoint(snap, snap.slots, NOW + 0.01).item() == pytest.approx(1.0)
    assert detector.per_endpoint(snap, snap.slots, NOW + 0.08).item() == pytest.approx(1.0)  # the scrape not overdue
    # a scrape outage: overdue (twice the interval) but not stale yet, by the knee and our bookings: no freeze
    assert detector.per_endpoint(snap, snap.slots, NOW + 0.2).item() == pytest.approx(max(5 / knee, 0.1))


def test_an_endpoint_not_yet_learned_borrows_the_pools_median_knee() -> None:
    table = table_with([dict(waiting=0, running=5, kv_usage=0.0)] * 3)
    snap = table.snapshot()
    detector = KneeDetector()
    _engine(detector, 0, 10, range(0, 30))
    _engine(detector, 1, 10, range(0, 30))
    per = detector.per_endpoint(snap, snap.slots, NOW)
    assert per[2] == pytest.approx(5 / float(np.median(detector.knees(snap.slots[:2]))))


def test_stale_data_lowers_confidence_toward_our_own_bookings_instead_of_full_or_empty() -> None:
    table = table_with([dict(waiting=0, running=20, kv_usage=0.5)] * 2)
    for _ in range(3):
        table.book_pick(0)
    freshness = Freshness(staleness_s=1.0)
    detector = KneeDetector(freshness=freshness)
    _engine(detector, 0, 10, range(0, 30))
    _engine(detector, 1, 10, range(0, 30))
    snap = table.snapshot()
    knee = detector.knees(snap.slots)
    fresh = detector.per_endpoint(snap, snap.slots, NOW)
    assert fresh[0] == pytest.approx(3.0)  # our 3 picks since the fresh scrape wait inside as far as it tells: full
    assert knee[1] < 20
    assert fresh[1] == pytest.approx(20 / 21)  # past its knee, but fresh, nothing waiting, nothing pending: untested
    half = detector.per_endpoint(snap, snap.slots, NOW + 2.0)  # twice the staleness: confidence 1/2
    assert half[0] == pytest.approx(max(0.5 * 23 + 0.5 * 3, 0.25) / knee[0])
    gone = detector.per_endpoint(snap, snap.slots, NOW + 1e6)  # only our own 3 in flight are left
    assert gone[0] == pytest.approx(3 / knee[0], rel=1e-3)
    assert gone[1] == pytest.approx(0.0, abs=1e-3)  # nothing of ours there: room, not a freeze
    gauge = PoolGauge(detector, freshness)
    assert gauge.saturation(snap, snap.slots, NOW + 1e6) == pytest.approx(gone.mean())  # no second fallback
    assert not gauge.last_stale


def test_observations_on_stale_features_move_the_knee_less() -> None:
    sure, unsure = KneeDetector(), KneeDetector()
    for detector, age in ((sure, 0.01), (unsure, 20.0)):  # 20 s: a tenth of the confidence
        _engine(detector, 0, 10, range(0, 30))
        for _ in range(20):
            detector.observe(_obs(0, 40, BASE_TTFT * 10, age=age))  # delayed near the knee? only if near
    assert sure.knees(np.array([0]))[0] <= unsure.knees(np.array([0]))[0]


def test_the_load_now_counts_our_requests_that_finished_since_the_scrape_out() -> None:
    table = table_with([dict(waiting=0, running=10, kv_usage=0.1)] * 2)
    detector = KneeDetector(freshness=Freshness(staleness_s=1.0))
    _engine(detector, 0, 40, range(0, 60))
    _engine(detector, 1, 40, range(0, 60))
    for slot in (0, 1):
        for _ in range(10):  # all ten running are ours, booked before the scrapes
            table.book_pick(slot)
    for at in (NOW - 0.1, NOW):  # scraped every 0.1 s
        for slot in (0, 1):
            table.record_scrape(slot, MetricsSample(waiting=0.0, running=10.0, kv_usage=0.1), now=at)
        snap = table.snapshot()
        detector.per_endpoint(snap, snap.slots, at)  # each scrape read: ten of ours in flight then
    for _ in range(6):
        table.book_pick(0)
        table.release_pick(0)  # six picks since the scrape, and six of ours finished
    snap = table.snapshot()
    knee = detector.knees(snap.slots)
    # before the next scrape is due, the six picks since count as waiting inside (as far as the scrape tells)
    assert detector.per_endpoint(snap, snap.slots, NOW + 0.15)[0] == pytest.approx(6.0)
    per = detector.per_endpoint(snap, snap.slots, NOW + 0.5)  # the next scrape overdue: by the knee
    assert per[0] == pytest.approx(10 / knee[0])  # not 10 + 6: the finished ones are gone
    assert per[1] == pytest.approx(10 / knee[1])


def test_before_any_request_finished_the_slow_start_reads_the_most_running_seen() -> None:
    table = table_with([dict(waiting=0, running=6, kv_usage=0.0)])
    detector = KneeDetector(freshness=Freshness(staleness_s=1.0))
    for _ in range(6):
        table.book_pick(0)
    table.record_scrape(0, MetricsSample(waiting=0.0, running=6.0, kv_usage=0.0), now=NOW)
    snap = table.snapshot()
    detector.per_endpoint(snap, snap.slots, NOW)
    table.book_pick(0)  # one more since: one waiting inside counts full, but no more than the slow start's knee
    snap = table.snapshot()
    assert detector.per_endpoint(snap, snap.slots, NOW).tolist() == pytest.approx([7 / 12])
    table.book_pick(0)
    snap = table.snapshot()
    assert detector.per_endpoint(snap, snap.slots, NOW + 1.5).item() == pytest.approx(8 / 12)  # stale: ours, 8


def test_between_scrapes_a_probing_endpoints_load_grows_at_most_by_pace_from_its_last_scrape() -> None:
    table = table_with([dict(waiting=0, running=5, kv_usage=0.0)])
    detector = KneeDetector(freshness=Freshness(staleness_s=1.0))
    for load in (0, 10, 24):  # held 25 without delay long ago: the slow start's knee is 50
        detector.observe(_obs(0, load, BASE_TTFT))
    assert detector.probing(np.array([0]))[0]
    for _ in range(5):
        table.book_pick(0)
    table.record_scrape(0, MetricsSample(waiting=0.0, running=5.0, kv_usage=0.0), now=NOW)
    snap = table.snapshot()
    assert detector.per_endpoint(snap, snap.slots, NOW).item() == 0.0  # slow start, nothing waiting inside
    table.book_pick(0)  # a burst within the scrape interval: 6 < PACE × 5, by the knee
    snap = table.snapshot()
    assert PACE * 5 > 6
    assert detector.per_endpoint(snap, snap.slots, NOW).item() == pytest.approx(6 / 50)
    table.book_pick(0)  # 7 ≥ PACE × what the scrape showed: full until the next scrape shows the room
    snap = table.snapshot()
    assert detector.per_endpoint(snap, snap.slots, NOW).item() == pytest.approx(1.0)
    assert detector.per_endpoint(snap, snap.slots, NOW + 1.5).item() < 1.0  # stale: by the knee and ours alone
    _engine(detector, 0, 8, range(0, 30))  # settled: the knee, and the picks since the fresh scrape
    snap = table.snapshot()
    assert not detector.probing(snap.slots)[0]
    assert detector.per_endpoint(snap, snap.slots, NOW).item() == pytest.approx(2.0)  # they wait inside: full


def _scraped_twice(detector: KneeDetector, running: float, waiting: float, ours: int) -> EndpointTable:
    """One endpoint scraped at NOW − 0.05 and at NOW (an interval of 0.05 s), `ours` of our requests in flight."""
    table = table_with([dict(waiting=0, running=0, kv_usage=0.0)], scraped_at=NOW - 0.05)
    snap = table.snapshot()
    detector.per_endpoint(snap, snap.slots, NOW - 0.05)
    for _ in range(ours):
        table.book_pick(0)
    table.record_scrape(0, MetricsSample(waiting=waiting, running=running, kv_usage=0.0), now=NOW)
    snap = table.snapshot()
    detector.per_endpoint(snap, snap.slots, NOW)
    return table


def test_the_slow_starts_pace_holds_only_until_the_next_scrape_is_overdue() -> None:
    """A scrape outage: the pace waits for a scrape that does not come; once it is overdue (twice the interval),
    the knee and our bookings count, as for the queue rule (else a pool held 1.25× its last scrape until its data
    counted stale)."""
    detector = KneeDetector(freshness=Freshness(staleness_s=1.0))
    for load in (0, 10, 24):  # the slow start's knee is 50
        detector.observe(_obs(0, load, BASE_TTFT))
    table = _scraped_twice(detector, running=5.0, waiting=0.0, ours=5)
    table.book_pick(0)
    table.book_pick(0)  # 7 ≥ PACE × 5
    snap = table.snapshot()
    assert detector.per_endpoint(snap, snap.slots, NOW + 0.05).item() == pytest.approx(1.0)  # the next scrape due
    assert detector.per_endpoint(snap, snap.slots, NOW + 0.2).item() == pytest.approx(7 / 50)  # overdue, c = 1


def test_a_request_the_scrape_showed_waiting_has_run_once_those_there_with_it_have_finished() -> None:
    detector = KneeDetector(freshness=Freshness(staleness_s=1.0))
    for load in (0, 10, 24):
        detector.observe(_obs(0, load, BASE_TTFT))
    table = _scraped_twice(detector, running=6.0, waiting=1.0, ours=7)  # all seven ours: one of them waits
    snap = table.snapshot()
    assert detector.per_endpoint(snap, snap.slots, NOW + 0.2).item() == pytest.approx(1.0)  # it may still wait
    for _ in range(7):
        table.release_pick(0)  # all seven finished
    table.book_pick(0)  # a new one since the scrape: not among those the scrape showed
    snap = table.snapshot()
    assert detector.per_endpoint(snap, snap.slots, NOW + 0.2).item() == pytest.approx(1 / 50)


def test_a_knee_below_the_load_held_is_tested_one_request_at_a_time_while_nothing_is_pending() -> None:
    """Past its knee with fresh data and nothing waiting inside it, an endpoint whose requests have all had their
    first byte gets no observation until some finish: its knee reads one above its load, so one request tests it;
    while that one's prefill is pending, or once anything waits inside, the knee counts as learned."""
    table = table_with([dict(waiting=0, running=30, kv_usage=0.1)])
    detector = KneeDetector(freshness=Freshness(staleness_s=1.0))
    _engine(detector, 0, 10, range(0, 30))
    for at in (NOW - 0.05, NOW):  # scraped every 50 ms
        table.record_scrape(0, MetricsSample(waiting=0.0, running=30.0, kv_usage=0.1), now=at)
        snap = table.snapshot()
        detector.per_endpoint(snap, snap.slots, at)
    knee = float(detector.knees(np.array([0]))[0])
    assert knee < 30 and not detector.probing(np.array([0]))[0]
    assert detector.per_endpoint(snap, snap.slots, NOW + 0.01).item() == pytest.approx(30 / 31)  # room for one
    table.book_prefill(0, 1000)  # one pick's prefill pending (its pick not counted here): the knee as learned
    snap = table.snapshot()
    assert detector.per_endpoint(snap, snap.slots, NOW + 0.01).item() == pytest.approx(30 / knee)
    table.release_prefill(0, 1000)  # its first byte: nothing pending, untested again
    table.record_scrape(0, MetricsSample(waiting=1.0, running=30.0, kv_usage=0.1), now=NOW + 0.05)
    snap = table.snapshot()  # but one waits inside (31 held): full, by the knee as learned
    assert detector.per_endpoint(snap, snap.slots, NOW + 0.06).item() == pytest.approx(31 / knee)
    table.record_scrape(0, MetricsSample(waiting=0.0, running=30.0, kv_usage=0.1), now=NOW + 0.1)
    snap = table.snapshot()
    assert detector.per_endpoint(snap, snap.slots, NOW + 0.11).item() == pytest.approx(30 / 31)
    assert detector.per_endpoint(snap, snap.slots, NOW + 1.5).item() > 1.0  # stale: the knee and our bookings


def test_as_a_filter_it_drops_endpoints_at_their_knee_but_never_all() -> None:
    table = table_with([dict(waiting=0, running=2, kv_usage=0.0), dict(waiting=0, running=40, kv_usage=0.0)])
    detector = KneeDetector()
    _engine(detector, 0, 10, range(0, 30))
    _engine(detector, 1, 10, range(0, 30))
    snap = table.snapshot()
    assert detector.filter(state(snap), snap.slots).tolist() == [0]
    assert detector.filter(state(snap), snap.slots[1:]).tolist() == [1]
    assert detector.describe().keys() == {address(0), address(1)}


CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- {type: self-calibrating-detector%s}
- {type: queue-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: self-calibrating-detector}
  - {pluginRef: queue-scorer}
  - {pluginRef: max-score-picker}
flowControl: {saturationDetector: {pluginRef: self-calibrating-detector}}
"""


def test_the_plugin_is_the_pools_detector_and_takes_no_parameters() -> None:
    scheduler = build_scheduler(load_config(None, text=CONFIG % "", warn=False))
    assert isinstance(scheduler.saturation, KneeDetector)
    with pytest.raises(ConfigError, match="queueDepthThreshold"):
        build_scheduler(load_config(None, text=CONFIG % ", parameters: {queueDepthThreshold: 1}", warn=False))


def test_the_recommended_self_calibrating_config_has_no_per_deployment_number() -> None:
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "configs" / "flow-control-self-calibrating.yaml"
    config = load_config(path, allow_experimental=True, warn=False)
    scheduler = build_scheduler(config, allow_experimental=True)
    assert isinstance(scheduler.saturation, KneeDetector)
    assert all(
        not spec.parameters
        for spec in config.plugins
        if spec.type not in ("prefix-cache-scorer", "priority-holdback-policy")
    )
