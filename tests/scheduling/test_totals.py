"""The compiled weighted total and tie search (epp/scheduling/_native.c) equal their numpy definitions
(epp.scheduling.totals): the same doubles, the same pick, the same draws."""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.scheduling import saturation, totals
from epp.scheduling.framework import Linear, weighted_term

# The inputs hold NaN, infinities and huge values on purpose: numpy's definition warns as it multiplies them, which
# is what it is asked to do here, not a finding.
pytestmark = pytest.mark.filterwarnings(
    "ignore:invalid value encountered:RuntimeWarning", "ignore:overflow encountered:RuntimeWarning"
)

needs_native = pytest.mark.skipif(totals.NATIVE is None, reason="the C extension is not built (or EPP_NATIVE=0)")

_SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, np.nan, np.inf, -np.inf, 1e-300, 1e300, 3.0]
value = st.one_of(
    st.sampled_from(_SPECIAL), st.floats(allow_nan=True, allow_infinity=True, width=64), st.integers(0, 5).map(float)
)
coef = st.one_of(st.sampled_from([0.0, -0.0, 1.0, -2.0, 2.0, 3.0, 1e-300, 1e300]), st.floats(-1e6, 1e6))
fill = st.one_of(st.none(), st.sampled_from([0.0, 0.5, -1.0, 1e308]), st.floats(-10, 10))


@st.composite
def terms(draw: st.DrawFn) -> tuple[list[tuple[np.ndarray, float, float | None]], float]:
    size = draw(st.integers(0, 40))
    count = draw(st.integers(1, 20))  # above the kernel's 16: the numpy code answers
    parts = [
        (np.array(draw(st.lists(value, min_size=size, max_size=size)), dtype=np.float64), draw(coef), draw(fill))
        for _ in range(count)
    ]
    return parts, draw(st.one_of(st.sampled_from([0.0, -0.0, 1.0, 7.0]), st.floats(-100, 100)))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal doubles, NaN where NaN (numpy's own `fmax` gives either sign of zero for −0 by the element's position
    in a SIMD lane, so the signs of zeros are not compared)."""
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


@needs_native
@settings(max_examples=400, deadline=None)
@given(terms())
def test_the_compiled_total_is_the_numpy_definition(case) -> None:
    parts, offset = case
    flat: list[object] = [x for part in parts for x in part]
    with np.errstate(all="ignore"):
        expected = totals.weighted_total_numpy(parts, offset)
        got = totals.weighted_total(flat, offset, parts[0][0].size)
    assert _same(got, expected)


@needs_native
def test_a_buffer_that_is_not_float64_runs_the_numpy_code() -> None:
    ints = np.arange(8, dtype=np.int64)
    floats = np.linspace(0, 1, 8)
    assert _same(totals.weighted_total([ints, 2.0, None, floats, 3.0, 0.5], 1.0, 8),
                 totals.weighted_total_numpy([(ints, 2.0, None), (floats, 3.0, 0.5)], 1.0))  # fmt: skip
    strided = np.linspace(0, 1, 16)[::2]
    assert _same(
        totals.weighted_total([strided, 2.0, None], 0.0, 8), totals.weighted_total_numpy([(strided, 2.0, None)], 0.0)
    )
    assert totals.max_tie(np.array([1, 3, 3]), 1e-9, lambda: 0.9) == 2


score = st.one_of(st.sampled_from([0.0, 1.0, 1.0 + 1e-10, 2.0, 2.0 - 5e-10, 3.0, np.inf]), st.floats(0, 10))


@needs_native
@settings(max_examples=400, deadline=None)
@given(st.lists(score, min_size=1, max_size=40), st.sampled_from([1e-9, 0.0, 0.5]), st.integers(0, 2**32))
def test_the_compiled_tie_search_is_the_numpy_definition(values, tie, seed) -> None:
    scores = np.array(values, dtype=np.float64)
    a, b = random.Random(seed), random.Random(seed)
    for _ in range(3):  # the same pick and the same draws (one only when there are several ties)
        assert totals.max_tie(scores, tie, a.random) == totals.max_tie_numpy(scores, tie, b.random)
    assert a.random() == b.random()


def test_nan_never_ties_and_a_total_of_nan_counts_zero() -> None:
    scores = np.array([np.nan, 1.0, np.nan])
    assert totals.max_tie(scores, 1e-9, lambda: 0.99) == 1 == totals.max_tie_numpy(scores, 1e-9, lambda: 0.99)
    values = np.array([np.nan, -3.0, 2.0])
    assert totals.weighted_total([values, 1.0, None], 0.0, 3).tolist() == [0.0, 0.0, 2.0]


def test_a_linear_term_is_its_part_weighted() -> None:
    form = Linear(np.array([0.0, np.nan, 2.0]), -0.5, 1.0, 0.5)
    part = form.part(2.0)
    assert part is not None and part[1:] == (-1.0, -1.0)
    term = form.term(2.0)
    assert term is not None and term.tolist() == [-0.0, -1.0, -2.0]
    assert Linear(None, 1.0, 0.3).part(2.0) is None and Linear(np.ones(2), 0.0, 0.3).part(2.0) is None


load = st.one_of(st.sampled_from([0.0, 1.0, 5.0, 5.5, np.nan, np.inf]), st.floats(0, 10))
COLUMNS = (load, load, st.booleans())


@needs_native
@settings(max_examples=400, deadline=None)
@given(
    st.integers(0, 40).flatmap(lambda n: st.tuples(*(st.lists(s, min_size=n, max_size=n) for s in COLUMNS))),
    st.booleans(),
    st.sampled_from([0.0, 5.0, 5.5, np.nan]),
    st.sampled_from([0.0, 0.8, 0.88, np.nan]),
)  # fmt: skip
def test_the_compiled_saturation_pass_is_the_numpy_definition(columns, with_fresh, queue_limit, kv_limit) -> None:
    types = (np.float64, np.float64, np.bool_)
    queue, kv, fresh = (np.array(c, dtype=d) for c, d in zip(columns, types, strict=True))
    candidates = np.arange(3, 3 + 2 * queue.size, 2, dtype=np.int64)
    mask = fresh if with_fresh else None
    got = saturation.kept_under(candidates, queue, kv, mask, queue_limit, kv_limit)
    expected = saturation.kept_under_numpy(candidates, queue, kv, mask, queue_limit, kv_limit)
    assert got.dtype == expected.dtype and got.tolist() == expected.tolist()


@needs_native
@settings(max_examples=300, deadline=None)
@given(terms())
def test_the_compiled_rows_are_each_terms_numpy_definition(case) -> None:
    parts, offset = case
    flat: list[object] = [x for part in parts for x in part]
    with np.errstate(all="ignore"):
        expected_total, expected_rows = totals.weighted_total_rows_numpy(parts, offset)
        total, rows = totals.weighted_total_rows(flat, offset, parts[0][0].size)
    assert _same(total, expected_total)
    assert _same(rows, expected_rows)
    assert rows.shape == (len(parts), parts[0][0].size)
    for row, part in zip(rows, parts, strict=True):
        assert _same(row, weighted_term(*part))
