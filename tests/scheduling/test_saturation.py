import pytest

from epp.scheduling.saturation import SaturationDetector
from tests.scheduling.tables import NAN, NOW, table_with


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
