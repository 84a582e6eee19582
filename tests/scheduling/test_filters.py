import pytest

from epp.config.model import SaturationThresholds
from epp.datastore import Freshness
from epp.scheduling.filters import LabelFilter, decode_filter, match_labels, prefill_filter
from epp.scheduling.framework import CycleState
from epp.scheduling.saturation import SaturationFilter
from tests.scheduling.tables import NAN, NOW, request, state, table_with

FRESH = dict(waiting=0, kv_usage=0.1)

SATURATION_CASES = [
    pytest.param([FRESH, dict(waiting=5, kv_usage=0.1)], [0], id="queue-at-threshold-dropped"),
    pytest.param([FRESH, dict(waiting=0, kv_usage=0.85)], [0], id="kv-over-threshold-dropped"),
    pytest.param([FRESH, dict(waiting=NAN, kv_usage=NAN)], [0, 1], id="unknown-is-not-over"),
    pytest.param([FRESH, dict(scraped=False)], [0], id="never-scraped-is-stale"),
    pytest.param([dict(waiting=9), dict(waiting=7)], [0, 1], id="all-over-keeps-all"),
]


@pytest.mark.parametrize(("rows", "kept"), SATURATION_CASES)
def test_saturation_filter_table(rows, kept) -> None:
    snap = table_with(rows).snapshot()
    assert SaturationFilter().filter(state(snap), snap.slots).tolist() == kept


def test_saturation_filter_drops_metrics_older_than_staleness() -> None:
    snap = table_with([FRESH, FRESH]).snapshot()
    snap.scraped_at[1] = NOW - 2.5  # the pool's threshold: 2 s by default
    assert SaturationFilter().filter(state(snap), snap.slots).tolist() == [0]
    snap.scraped_at[1] = NOW - 0.5
    short = CycleState(snap, snap.slots, request(), NOW, Freshness(staleness_s=0.2))
    assert SaturationFilter().filter(short, snap.slots).tolist() == [0]


def test_saturation_filter_drops_endpoints_failing_max_failures_times() -> None:
    table = table_with([FRESH, FRESH])
    for _ in range(2):
        table.record_scrape_failure(1)
    snap = table.snapshot()
    assert SaturationFilter().filter(state(snap), snap.slots).tolist() == [0, 1]
    assert SaturationFilter().filter(
        CycleState(snap, snap.slots, request(), NOW, Freshness(max_failures=2)), snap.slots
    ).tolist() == [0]


def test_saturation_filter_counts_own_picks_and_headroom() -> None:
    table = table_with([FRESH, FRESH])
    for _ in range(5):
        table.book_pick(0)
    snap = table.snapshot()
    assert SaturationFilter().filter(state(snap), snap.slots).tolist() == [1]
    roomy = SaturationFilter(thresholds=SaturationThresholds(headroom=0.5))  # limit 7.5
    assert roomy.filter(state(snap), snap.slots).tolist() == [0, 1]


LABELS = [{"llm-d.ai/role": "decode"}, {"llm-d.ai/role": "prefill"}, {"llm-d.ai/role": "both"}, {"zone": "a"}]


@pytest.mark.parametrize(
    ("make", "kept"),
    [
        pytest.param(decode_filter, [0, 2, 3], id="decode-or-both-or-unlabelled"),
        pytest.param(prefill_filter, [1, 2], id="prefill-or-both"),
        pytest.param(lambda n: LabelFilter("label-filter", n, match_labels({"zone": "a"})), [3], id="match-labels"),
        pytest.param(lambda n: LabelFilter("label-filter", n, match_labels({"zone": "b"})), [], id="none-match"),
    ],
)
def test_label_filters(make, kept) -> None:
    snap = table_with([{}] * 4, labels=LABELS).snapshot()
    assert make("f").filter(state(snap), snap.slots).tolist() == kept
