import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.scheduling.saturation import SaturationDetector
from tests.scheduling.tables import NAN, NOW, request, table_with


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        pytest.param([dict(waiting=0, kv_usage=0.0)] * 2, 0.0, id="idle"),
        pytest.param([dict(waiting=5, kv_usage=0.0), dict(waiting=0, kv_usage=0.4)], 0.75, id="roofline-mean"),
        pytest.param([dict(waiting=10, kv_usage=0.9)], 2.0, id="queue-bound"),
        pytest.param([dict(waiting=NAN, kv_usage=0.8)], 1.0, id="nan-side-ignored"),
        pytest.param([dict(waiting=NAN, kv_usage=NAN)], 0.0, id="nothing-known-is-not-load"),
        pytest.param([dict(scraped=False), dict(waiting=0, kv_usage=0.0)], 0.5, id="stale-counts-full"),
    ],
)
def test_saturation_table(rows, expected) -> None:
    snap = table_with(rows).snapshot()
    assert SaturationDetector().saturation(snap, snap.slots, NOW) == pytest.approx(expected)


def test_own_picks_since_scrape_raise_saturation() -> None:
    table = table_with([dict(waiting=0, kv_usage=0.0)])
    detector = SaturationDetector()
    assert not detector.saturated(table.snapshot(), table.snapshot().slots, NOW)
    for _ in range(5):
        table.book_pick(0)
    snap = table.snapshot()
    assert detector.saturated(snap, snap.slots, NOW)


def test_no_candidates_is_saturated() -> None:
    import numpy as np

    snap = table_with([{}]).snapshot()
    assert SaturationDetector().saturation(snap, np.zeros(0, dtype=np.int64), NOW) == 1.0


signal = st.one_of(st.just(NAN), st.floats(0, 12))
filter_row = st.fixed_dictionaries(
    {"waiting": signal, "kv_usage": st.one_of(st.just(NAN), st.floats(0, 1.2)), "scraped": st.booleans()}
)


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(filter_row, min_size=1, max_size=16), stale=st.lists(st.booleans(), min_size=16, max_size=16))
def test_the_filter_keeps_the_same_endpoints_on_small_and_large_pools(rows, stale) -> None:
    """Up to 32 candidates the exact filter runs on lists, beyond on numpy: the same rows, the same verdicts."""
    from epp.scheduling.framework import CycleState
    from epp.scheduling.saturation import SaturationFilter

    def kept(copies: int) -> list[int]:
        table = table_with(rows * copies)
        for slot in range(len(rows) * copies):
            if stale[slot % len(rows)]:
                for _ in range(3):
                    table.record_scrape_failure(slot)
        snap = table.snapshot()
        state = CycleState(snap, snap.slots, request(), NOW)
        return SaturationFilter().filter(state, snap.slots).tolist()

    small, large = kept(1), kept(33 // len(rows) + 1)  # ≤ 16 candidates, then more than 32 of the same rows
    assert [s for s in large if s < len(rows)] == small


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(filter_row, min_size=1, max_size=40), picks=st.lists(st.integers(0, 39), max_size=40))
def test_the_filter_keeps_exactly_the_usable_endpoints_under_the_limits(rows, picks) -> None:
    """The filter's one rule, endpoint by endpoint: usable data, effective queue and KV usage under the limits
    (unknown is not over); everyone when that would leave no one. The extremes-based shortcut agrees."""
    from epp.datastore import Freshness, usable
    from epp.scheduling.framework import CycleState
    from epp.scheduling.saturation import SaturationFilter

    table = table_with(rows)
    for slot in picks:
        if slot < len(rows):
            table.book_pick(slot)
    snap = table.snapshot()
    freshness = Freshness()
    expected = [
        slot
        for slot in range(len(rows))
        if usable(float(snap.scraped_at[slot]), int(snap.scrape_failures[slot]), NOW, freshness)
        and not (snap.waiting[slot] + snap.picks_since_scrape[slot] >= 5 or snap.kv_usage[slot] >= 0.8)
    ]
    state = CycleState(snap, snap.slots, request(), NOW, freshness)
    assert SaturationFilter().filter(state, snap.slots).tolist() == (expected or list(range(len(rows))))
