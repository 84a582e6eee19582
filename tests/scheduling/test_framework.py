"""CycleState's shared per-pick values: extremes agree with numpy's reductions, signals read unusable data as unknown,
and `Linear` adds up to the score it stands for."""

import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from epp.datastore import Freshness
from epp.scheduling import framework
from epp.scheduling.framework import CycleState, Linear, Signal, extremes
from tests.scheduling.tables import NAN, NOW, request, state, table_with

values = st.lists(
    st.one_of(st.floats(min_value=-1e6, max_value=1e6), st.just(NAN), st.just(math.inf), st.just(-math.inf)),
    min_size=1,
    max_size=40,
)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@given(values)
@example([math.inf, -math.inf, 1.0])  # the sum is NaN without a NaN: numpy decides
@example([NAN] + [1.0] * 39)  # a NaN beyond the small-list limit
@example([NAN, 2.0])  # a NaN within it
def test_extremes_match_numpy_reductions_with_and_without_nan(column: list[float]) -> None:
    array = np.array(column)
    lo, hi, unknown = extremes(array)
    assert unknown == bool(np.isnan(array).any())
    assert _same(lo, float(np.fmin.reduce(array))) and _same(hi, float(np.fmax.reduce(array)))


def _identical(a: object, b: object) -> bool:
    """The same value of the same type, the sign of a zero included (NaN equal to NaN)."""
    if a.__class__ is not b.__class__:
        return False
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1.0, a) == math.copysign(1.0, b))
    return a == b


small = st.one_of(
    st.lists(
        st.one_of(st.sampled_from([0.0, -0.0, 1.0, NAN, math.inf, -math.inf, 1e308, -1e308]), st.floats()),
        max_size=34,
    ).map(lambda xs: np.array(xs, dtype=np.float64)),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=34).map(lambda xs: np.array(xs, dtype=np.int64)),
)


@pytest.mark.skipif(framework._SMALL is None, reason="the C extension is not built (or EPP_NATIVE=0)")
@given(small)
@example(np.array([1e308, 1e308, -math.inf]))  # the sum overflows to inf, then inf − inf: NaN without a NaN
@example(np.array([0.0, -0.0]))
@example(np.array([-0.0, 0.0]))
def test_the_compiled_small_extremes_are_the_list_definition(array: np.ndarray) -> None:
    framework._RECENT.clear()
    expected = framework.small_extremes(array)
    assert framework._SMALL is not None
    got = framework._SMALL(array)
    if got is not NotImplemented:  # where it answers, the same values of the same types
        assert isinstance(got, tuple) and len(got) == 3
        assert all(_identical(a, b) for a, b in zip(got, expected, strict=True))
    else:  # only an empty array, or a sum that is NaN, is left to the definition
        assert array.size == 0 or array.size > framework.SMALL_POOL or math.isnan(sum(array.tolist()))
    if array.size <= framework.SMALL_POOL:
        assert all(_identical(a, b) for a, b in zip(extremes(array), expected, strict=True))


def test_signal_extremes_are_per_candidate_set_and_cover_the_effective_queue() -> None:
    table = table_with([{"waiting": 1.0}, {"waiting": 4.0}, {"waiting": 2.0}])
    table.book_pick(0)
    table.book_pick(0)
    s = state(table.snapshot())
    assert s.signal(Signal.EFFECTIVE_QUEUE, s.candidates)[1] == (2.0, 4.0, False)  # slot 2: 2 waiting, no picks
    narrowed = s.candidates[[0, 2]]
    assert s.signal(Signal.WAITING, narrowed)[1] == (1.0, 2.0, False)
    assert s.signal(Signal.WAITING, s.candidates)[1] == (1.0, 4.0, False)


def test_extremes_of_no_candidates_are_nan() -> None:
    s = state(table_with([{"waiting": 1.0}]).snapshot())
    lo, hi, _ = s.signal(Signal.WAITING, s.candidates[:0])[1]
    assert math.isnan(lo) and math.isnan(hi)


@pytest.mark.parametrize("signal", Signal.ALL, ids=repr)
def test_signals_read_their_snapshot_column(signal: Signal) -> None:
    s = state(table_with([{"waiting": 1, "running": 2, "kv_usage": 0.25}, {"waiting": 3, "running": 4}]).snapshot())
    expected = {"waiting": [1, 3], "running": [2, 4], "kv_usage": [0.25, NAN], "effective_queue": [1, 3]}
    got = s.signal(signal, s.candidates)[0].tolist()
    assert all(_same(a, b) for a, b in zip(got, expected[signal.column], strict=True))


def test_unusable_data_reads_as_unknown() -> None:
    table = table_with([{"waiting": 1}, {"waiting": 2}, {"waiting": 3}, {"scraped": False}])
    for _ in range(3):
        table.record_scrape_failure(2)
    snap = table.snapshot()
    snap.scraped_at[1] = NOW - 2.5  # older than the 2 s threshold
    s = CycleState(snap, snap.slots, request(), NOW, Freshness(staleness_s=2.0, max_failures=3))
    usable = s.usable(s.candidates)
    assert usable is not None and usable.tolist() == [True, False, False, False]
    waiting, bounds = s.signal(Signal.WAITING, s.candidates)
    assert waiting[0] == 1 and np.isnan(waiting[1:]).all() and bounds == (1.0, 1.0, True)
    fresh = state(table_with([{"waiting": 1}, {"waiting": 2}]).snapshot())
    assert fresh.usable(fresh.candidates) is None  # all usable: no mask, no per-endpoint pass


@given(
    st.lists(st.one_of(st.just(NAN), st.floats(-10, 10)), min_size=1, max_size=40),
    st.floats(-3, 3),
    st.floats(-3, 3),
    st.floats(0, 1),
    st.floats(0.1, 5),
)
def test_a_linear_term_adds_up_to_its_scores(column: list[float], scale: float, offset: float, fill, weight) -> None:
    array = np.array(column)
    form = Linear(array, scale, offset, fill)
    expected = np.where(np.isnan(array), fill, array * scale + offset)
    term = form.term(weight)
    total = np.full(array.size, weight * offset) if term is None else term + weight * offset
    np.testing.assert_allclose(total, weight * expected, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(form.scores(array.size), np.clip(expected, 0, 1), rtol=1e-12, atol=1e-12)
