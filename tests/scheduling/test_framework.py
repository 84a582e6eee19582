"""CycleState's shared per-pick values: column extremes are computed once and agree with numpy's reductions."""

import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.scheduling.tables import NAN, state, table_with

values = st.lists(
    st.one_of(st.floats(min_value=-1e6, max_value=1e6), st.just(NAN), st.just(math.inf), st.just(-math.inf)),
    min_size=1,
    max_size=40,
)


@given(values)
@example([math.inf, -math.inf, 1.0])  # the sum is NaN without a NaN: numpy decides
@example([NAN] + [1.0] * 39)  # a NaN beyond the small-list limit
def test_extremes_match_numpy_reductions_with_and_without_nan(waiting: list[float]) -> None:
    s = state(table_with([{"waiting": w} for w in waiting]).snapshot())
    column = np.array(waiting)
    expected = (np.minimum.reduce(column), np.maximum.reduce(column))  # NaN when any is NaN
    got = (s.extreme("waiting", s.candidates, False), s.extreme("waiting", s.candidates, True))
    for value, want in zip(got, expected, strict=True):
        assert (math.isnan(value) and math.isnan(want)) or value == want


def test_extremes_are_per_candidate_set_and_cover_the_effective_queue() -> None:
    table = table_with([{"waiting": 1.0}, {"waiting": 4.0}, {"waiting": 2.0}])
    table.book_pick(0)
    table.book_pick(0)
    s = state(table.snapshot())
    assert s.extreme("effective_queue", s.candidates, False) == 2.0  # slot 2: 2 waiting, no picks
    assert s.extreme("effective_queue", s.candidates, True) == 4.0
    narrowed = s.candidates[[0, 2]]
    assert s.extreme("waiting", narrowed, True) == 2.0
    assert s.extreme("waiting", s.candidates, True) == 4.0


def test_extreme_of_no_candidates_is_nan() -> None:
    s = state(table_with([{"waiting": 1.0}]).snapshot())
    assert math.isnan(s.extreme("waiting", s.candidates[:0], True))


@pytest.mark.parametrize("column", ["kv_usage", "scraped_at", "scrape_failures"])
def test_extremes_read_any_snapshot_column(column: str) -> None:
    s = state(table_with([{"kv_usage": 0.25}, {"kv_usage": 0.5}], scraped_at=7.0).snapshot())
    low, high = s.extreme(column, s.candidates, False), s.extreme(column, s.candidates, True)
    assert (low, high) == {"kv_usage": (0.25, 0.5), "scraped_at": (7.0, 7.0), "scrape_failures": (0, 0)}[column]
