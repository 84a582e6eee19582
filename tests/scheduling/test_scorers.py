import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from epp.datastore.table import MetricsSample
from epp.scheduling.scorers import (
    InflightLoadScorer,
    KvCacheUtilizationScorer,
    QueueScorer,
    RunningRequestsScorer,
    lower_is_better,
)
from tests.scheduling.tables import NAN, NOW, state, table_with

CASES = [
    # (scorer, rows, expected scores)
    pytest.param(QueueScorer(), [{"waiting": 0}, {"waiting": 5}, {"waiting": 10}], [1.0, 0.5, 0.0], id="queue-minmax"),
    pytest.param(QueueScorer(), [{"waiting": 3}, {"waiting": 3}], [1.0, 1.0], id="queue-all-equal-is-1"),
    pytest.param(
        QueueScorer(), [{"waiting": 0}, {"waiting": NAN}, {"waiting": 4}], [1.0, 0.5, 0.0], id="queue-nan-0.5"
    ),
    pytest.param(QueueScorer(), [{"waiting": NAN}, {"scraped": False}], [0.5, 0.5], id="queue-all-unknown"),
    pytest.param(RunningRequestsScorer(), [{"running": 2}, {"running": 6}], [1.0, 0.0], id="running-minmax"),
    pytest.param(KvCacheUtilizationScorer(), [{"kv_usage": 0.25}, {"kv_usage": 1.0}], [0.75, 0.0], id="kv-1-minus"),
    pytest.param(KvCacheUtilizationScorer(), [{"kv_usage": NAN}, {"scraped": False}], [0.5, 0.5], id="kv-nan-0.5"),
    pytest.param(InflightLoadScorer(), [{"waiting": 2}, {"waiting": 4}], [1.0, 0.0], id="inflight-no-picks"),
    pytest.param(
        InflightLoadScorer(),
        [{"waiting": 1}, {"waiting": NAN}, {"waiting": 3}],
        [1.0, 0.5, 0.0],
        id="inflight-nan-is-mean",
    ),
]


@pytest.mark.parametrize(("scorer", "rows", "expected"), CASES)
def test_scorer_table(scorer, rows, expected) -> None:
    snap = table_with(rows).snapshot()
    got = scorer.score(state(snap), snap.slots)
    assert got.tolist() == pytest.approx(expected)


def test_inflight_load_counts_own_picks_since_the_last_scrape() -> None:
    table = table_with([{"waiting": 0}, {"waiting": 2}])
    for _ in range(4):
        table.book_pick(0)  # four picks the scrape has not seen: effective queue 4 vs 2
    snap = table.snapshot()
    assert InflightLoadScorer().score(state(snap), snap.slots).tolist() == [0.0, 1.0]
    assert QueueScorer().score(state(snap), snap.slots).tolist() == [1.0, 0.0]  # upstream's view: stale


def test_inflight_load_with_no_data_usable_ranks_our_prefill_booked_not_our_picks_since_the_scrape() -> None:
    # Every scrape 100 s old (unusable): no typical queue. Endpoint 0 was picked least since its scrape (1 pick
    # against 5 and 3) but its one pick is still prefilling 1,000 tokens; the others' picks have had their first
    # byte (prefill released) but one of endpoint 2's, 300 tokens.
    table = table_with([{"waiting": 0}, {"waiting": 0}, {"waiting": 0}], scraped_at=NOW - 100.0)
    for slot, picks in ((0, 1), (1, 5), (2, 3)):
        for _ in range(picks):
            table.book_pick(slot, 1000, 1000)
    table.release_prefill(1, 5000)
    table.release_prefill(2, 2700)
    snap = table.snapshot()
    assert InflightLoadScorer().score(state(snap), snap.slots).tolist() == pytest.approx([0.0, 1.0, 0.7])
    # One endpoint's data usable again: an unknown one is the known queue (2) plus its picks (1 and 3), as before.
    table.record_scrape(1, MetricsSample(waiting=2.0), now=NOW)
    snap = table.snapshot()
    assert InflightLoadScorer().score(state(snap), snap.slots).tolist() == pytest.approx([2 / 3, 1.0, 0.0])


@example([0.0, 2.225073858507203e-309])  # a subnormal range: 1/range overflowed to inf once
@given(st.lists(st.one_of(st.floats(0, 1e6), st.just(math.nan)), min_size=1, max_size=50))
def test_lower_is_better_stays_in_unit_interval(values) -> None:
    form = lower_is_better(np.array(values, dtype=np.float64))
    term = form.term(1.0)  # unclamped: what the runner adds
    out = np.full(len(values), form.offset) if term is None else term + form.offset
    assert np.all((out >= -1e-12) & (out <= 1 + 1e-12))
